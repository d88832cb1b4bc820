"""Quantize an engine checkpoint's linear layers to weight-only INT8 or INT4 (new checkpoint).

    python quantize.py --checkpoint_path checkpoints/smollm2 --mode int8     # -> checkpoints/smollm2-int8
    python quantize.py --mode int4                                          # the default model, groups of 32
    python generate.py --checkpoint_path checkpoints/smollm2-int8 --prompt "..."

The new directory holds config.json (with "quantization": {"mode", "groupsize"}, and
"float_checkpoint": the directory quantized, whose float weights bench.py's peers run), the
quantized model.safetensors and the source's tokenizer files; it appears whole or not at all.
"""
from engine.cli import CHECKPOINT_HELP, Parser, run


def main(argv=None) -> None:
    from engine.loading.checkpoint import quantize_checkpoint
    from engine.loading.default_model import resolve_checkpoint
    from quantize.weights import GROUPSIZES, MODES

    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint_path", default=None, help=CHECKPOINT_HELP)
    p.add_argument("--mode", choices=list(MODES), required=True)
    p.add_argument("--groupsize", type=int, choices=list(GROUPSIZES), default=None,
                   help="int4 only: input columns per scale/zero (default: 32, the most accurate)")
    p.add_argument("--out", default=None,
                   help="output directory (default: DIR-int8 or DIR-int4-gG next to DIR)")
    args = p.parse_args(argv)
    out = quantize_checkpoint(resolve_checkpoint(args.checkpoint_path), args.mode,
                              args.groupsize, args.out)
    print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
