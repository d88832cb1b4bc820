#!/bin/sh
# s64's measurements on machine D at the final code (docs/PERFORMANCE.md, 6zn): s63's, here.
exec sh "$(dirname "$0")/../s63/run.sh" s64
