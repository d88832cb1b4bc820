"""Convert a Hugging Face directory, a hub repo id or a llama .gguf file into an engine checkpoint.

    python convert_hf.py HuggingFaceTB/SmolLM2-135M-Instruct --out checkpoints/smollm2
    python convert_hf.py path/to/hf_dir --out checkpoints/mine --dtype bfloat16
    python convert_hf.py model.Q4_1.gguf --out checkpoints/from_gguf   # dequantized, float32
"""
from engine.cli import DTYPES, Parser, run
from engine.loading.convert import convert


def main(argv=None) -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="HF checkpoint directory, hub repo id (org/name) or .gguf")
    parser.add_argument("--out", required=True, help="output checkpoint directory")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None,
                        help="weight dtype (default: the source's dtype; float32 for GGUF)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    args = parser.parse_args(argv)
    convert(args.source, args.out, dtype=args.dtype, force=args.force)


if __name__ == "__main__":
    run(main)
