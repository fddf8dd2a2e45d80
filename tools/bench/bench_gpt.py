"""Training speed of ``tfm_course.models.gpt.GPT`` against a nanoGPT-style reference, side by side.

    python tools/bench/bench_gpt.py                 # nanoGPT's CPU recipe: 4 layers, 4 heads, width 128,
                                              # block 64, batch 12, vocabulary 65, no bias, dropout 0
    python tools/bench/bench_gpt.py --threads 1 --repeats 7

The reference below is written for this script from the GPT-2 description (Radford et al., 2019) with
the module layout of nanoGPT's ``model.py``: a LayerNorm module calling ``F.layer_norm``, one fused
Q/K/V projection (``c_attn``), the fused causal kernel, an MLP module with ``nn.GELU`` (the exact
GELU), dropout modules (p = 0 here, as in nanoGPT's CPU recipe, but called as nanoGPT calls them), the
output layer tied to the token embedding. Both models run the same
function (the script copies our weights into the reference and checks the logits agree), in one
process, one after the other: each repeat times ``--steps`` forward+backward passes of each model,
alternating which goes first, on the same batches. Tokens per second count batch × block per pass.
The machine may be shared: the best repeat of each model is the steadier figure (other programs only
ever add time), and on the CPU the process's CPU time is printed too, which other programs barely
touch (with one thread it is the compute time itself); the median of the per-repeat ratios is
printed as well. Not run by the tests.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tfm_course.experiments.measure import synchronize  # noqa: E402
from tfm_course.device import describe, get_device  # noqa: E402
from tfm_course.models.gpt import GPT, GPTConfig  # noqa: E402


# --------------------------------------------------------------------------- the reference
class RefLayerNorm(nn.Module):
    """LayerNorm with an optional bias (``nn.LayerNorm`` gained ``bias=`` only in PyTorch 2.1)."""

    def __init__(self, d: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class RefAttention(nn.Module):
    def __init__(self, d: int, heads: int, bias: bool, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)  # Q, K and V in one matrix multiply
        self.c_proj = nn.Linear(d, d, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class RefMLP(nn.Module):
    def __init__(self, d: int, bias: bool, dropout: float) -> None:
        super().__init__()
        self.c_fc, self.gelu = nn.Linear(d, 4 * d, bias=bias), nn.GELU()
        self.c_proj, self.dropout = nn.Linear(4 * d, d, bias=bias), nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class RefBlock(nn.Module):
    def __init__(self, d: int, heads: int, bias: bool, dropout: float) -> None:
        super().__init__()
        self.ln_1, self.attn = RefLayerNorm(d, bias), RefAttention(d, heads, bias, dropout)
        self.ln_2, self.mlp = RefLayerNorm(d, bias), RefMLP(d, bias, dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class RefGPT(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.block_size = c.max_len
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.d_model), nn.Embedding(c.max_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.h = nn.ModuleList(RefBlock(c.d_model, c.n_heads, c.bias, c.dropout) for _ in range(c.n_layers))
        self.ln_f = RefLayerNorm(c.d_model, c.bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        t = idx.shape[1]
        assert t <= self.block_size, f"sequence of {t} tokens, block size {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)


def copy_into_reference(ours: GPT, ref: RefGPT) -> None:
    """Give the reference our weights, so the two compute the same function."""
    def linear(dst: nn.Linear, weight: Tensor, bias: Tensor | None) -> None:
        dst.weight.copy_(weight)
        if bias is not None:
            dst.bias.copy_(bias)

    def norm(dst: nn.Module, src: nn.Module) -> None:
        linear(dst, src.weight, src.bias)

    with torch.no_grad():
        ref.wte.weight.copy_(ours.tok_embed.weight)
        ref.wpe.weight.copy_(ours.pos_embed.weight)
        norm(ref.ln_f, ours.norm)
        for r, o in zip(ref.h, ours.blocks):
            norm(r.ln_1, o.norm1)
            norm(r.ln_2, o.norm2)
            linear(r.attn.c_attn, o.attn.qkv.weight, o.attn.qkv.bias)
            linear(r.attn.c_proj, o.attn.out_proj.weight, o.attn.out_proj.bias)
            linear(r.mlp.c_fc, o.ffn.linear1.weight, o.ffn.linear1.bias)
            linear(r.mlp.c_proj, o.ffn.linear2.weight, o.ffn.linear2.bias)


# --------------------------------------------------------------------------- timing
def train_pass(model: nn.Module, x: Tensor, y: Tensor) -> None:
    _, loss = model(x, y)
    loss.backward()
    for p in model.parameters():
        p.grad = None


def seconds(model: nn.Module, batches: list[tuple[Tensor, Tensor]],
            device: torch.device) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process, all threads) of one forward+backward per batch."""
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for x, y in batches:
        train_pass(model, x, y)
    synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=65)
    parser.add_argument("--bias", action="store_true", help="biases everywhere (nanoGPT: off)")
    parser.add_argument("--steps", type=int, default=10, help="passes per timed repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    parser.add_argument("--control", action="store_true",
                        help="also time a second copy of the reference: the ratio of two identical "
                             "models is the noise floor of the measurement")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = get_device()
    config = GPTConfig(vocab_size=args.vocab, max_len=args.block, d_model=args.width,
                       n_layers=args.layers, n_heads=args.heads, dropout=0.0, bias=args.bias,
                       activation="gelu")
    torch.manual_seed(0)
    ours = GPT(config).to(device).train()
    ref = RefGPT(config).to(device).train()
    copy_into_reference(ours, ref)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, args.vocab, (args.batch, args.block), generator=g).to(device),
                torch.randint(0, args.vocab, (args.batch, args.block), generator=g).to(device))
               for _ in range(args.steps)]
    with torch.no_grad():
        (ours_logits, ours_loss), (ref_logits, ref_loss) = ours(*batches[0]), ref(*batches[0])
    torch.testing.assert_close(ours_logits, ref_logits, atol=1e-4, rtol=1e-4)

    models = {"tfm_course GPT": ours, "nanoGPT-style reference": ref}
    if args.control:
        models["reference, second copy"] = copy.deepcopy(ref)
    for model in models.values():  # warm-up: allocator, kernels, autograd graph caches
        seconds(model, batches[:2], device)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    for repeat in range(args.repeats):
        order = list(models) if repeat % 2 == 0 else list(models)[::-1]
        for name in order:
            times[name].append(seconds(models[name], batches, device))

    tokens = args.steps * args.batch * args.block
    n_params = sum(p.numel() for p in ours.parameters())
    print(f"{describe(device)}, {torch.get_num_threads()} thread(s), torch {torch.__version__}")
    print(f"GPT: {args.layers} layers, {args.heads} heads, width {args.width}, block {args.block}, "
          f"batch {args.batch}, vocabulary {args.vocab}, bias {args.bias}: {n_params:,} parameters")
    print(f"forward + backward, {args.repeats} interleaved repeats of {args.steps} passes:")
    ours_name, ref_name = list(models)[:2]
    for clock, i in (("wall-clock", 0), ("CPU time", 1)):
        if clock == "CPU time" and device.type != "cpu":
            continue  # the CPU only queues GPU work: its time says nothing
        note = " (what this process computed, whatever else runs)" if clock == "CPU time" else ""
        print(f"  {clock}{note}:")
        for name, t in times.items():
            per = [tokens / run[i] for run in t]
            print(f"    {name:26s} best {max(per):9,.0f} tokens/s   median {statistics.median(per):9,.0f}")
        best_ratio = min(r[i] for r in times[ref_name]) / min(o[i] for o in times[ours_name])
        paired = [r[i] / o[i] for r, o in zip(times[ref_name], times[ours_name])]
        print(f"    ratio ours / reference (tokens/s): best-of-each {best_ratio:.3f}, "
              f"median of paired repeats {statistics.median(paired):.3f}")
        if args.control:
            copy_name = list(models)[2]
            best_control = min(r[i] for r in times[ref_name]) / min(c[i] for c in times[copy_name])
            paired = [r[i] / c[i] for r, c in zip(times[ref_name], times[copy_name])]
            print(f"    control, second copy / reference: best-of-each {best_control:.3f}, "
                  f"median of paired repeats {statistics.median(paired):.3f} (1 without noise)")


if __name__ == "__main__":
    main()
