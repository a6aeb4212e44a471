"""
How much the KV cache buys: tokens/s of the cached sampler against the reference one that recomputes the whole
context for every token, at 4 x and 16 x the trained block_size, for one position scheme.

    python bench/generation.py                       # nanoGPT's CPU recipe model (4 layers, 4 heads, 128 dims, T=64)
    python bench/generation.py --pos=alibi --repeats=5
    python bench/generation.py --out_dir=out/shakespeare_char_rope   # a trained checkpoint instead

Both samplers run greedy decoding from the same one-token prompt, so they produce the same tokens (checked),
and each timing is the median of --repeats runs in this one process.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: model.py is one folder up

from model import GPT, POS_SCHEMES, GPTConfig  # noqa: E402
from checkpoint import load_model  # noqa: E402


def median_seconds(fn, repeats, device):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()  # kernels run asynchronously: wait for them before reading the clock
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pos", choices=POS_SCHEMES, default="rope", help="scheme of the random-init model")
    parser.add_argument("--out_dir", default=None, help="benchmark this checkpoint instead of a random-init model")
    parser.add_argument("--multiples", type=int, nargs="+", default=[4, 16], help="lengths, in block_size units")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    if args.out_dir:
        model = load_model(args.out_dir, args.device)[0]
    else:
        config = GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, pos=args.pos)
        model = GPT(config).to(args.device).eval()
    block_size = model.config.block_size
    prompt = torch.zeros(1, 1, dtype=torch.long, device=args.device)
    print(f"pos={model.config.pos}, {model.num_params():,} parameters, block_size {block_size}, "
          f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'new tokens':>10} {'cached tok/s':>13} {'reference tok/s':>16} {'speed-up':>9}")
    for multiple in args.multiples:
        n = multiple * block_size
        timed = lambda sampler: median_seconds(lambda: sampler(prompt, n, temperature=0), args.repeats, args.device)
        cached_s, cached = timed(model.generate_cached)
        reference_s, reference = timed(model.generate)
        assert torch.equal(cached, reference), "the cached sampler must produce the reference's tokens"
        print(f"{n:>10} {n / cached_s:>13.1f} {n / reference_s:>16.1f} {reference_s / cached_s:>8.1f}x")


if __name__ == "__main__":
    main()
