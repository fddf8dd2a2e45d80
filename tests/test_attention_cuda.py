"""Attention on real CUDA hardware (``pytest -m gpu``; skipped without a GPU).

What a CPU cannot show: that ``is_causal=True`` lets PyTorch run FlashAttention (or, below compute
capability 8.0, the memory-efficient kernel) while a materialised mask rules FlashAttention out;
that the fused path never makes the CPU wait; and parity with ``nn.MultiheadAttention`` on the
GPU's kernels, with fp32 matmuls (no TF32) for the fp32 comparison.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from cuda_helpers import fp32_matmuls, needs_cuda
from torch import nn

from tfm_course.attention import (MultiHeadAttention, causal_mask, fused_attention, padding_mask,
                                  scaled_dot_product_attention)

TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _qkv(dtype, batch=2, heads=4, n=128, d_head=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    return tuple(torch.randn(batch, heads, n, d_head, device="cuda", dtype=dtype, generator=g)
                 for _ in range(3))


def _fast_backend():
    from torch.nn.attention import SDPBackend

    major, _ = torch.cuda.get_device_capability()
    return SDPBackend.FLASH_ATTENTION if major >= 8 else SDPBackend.EFFICIENT_ATTENTION


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_is_causal_runs_on_the_fused_kernel_and_matches_the_maths(dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bf16 kernels need compute capability 8.0")
    q, k, v = _qkv(dtype)
    backend = _fast_backend()
    with sdpa_kernel(backend):  # only this kernel may run: anything else raises
        out = fused_attention(q, k, v, is_causal=True)
    want = scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), want, atol=TOL[dtype], rtol=TOL[dtype])
    if backend == SDPBackend.FLASH_ATTENTION:
        with sdpa_kernel(backend), pytest.raises(RuntimeError), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch warns why each kernel refused, then raises
            fused_attention(q, k, v, causal_mask(q.shape[-2], device="cuda"))  # a materialised mask


@needs_cuda
def test_multi_head_attention_is_causal_reaches_the_fused_kernel():
    from torch.nn.attention import sdpa_kernel

    torch.manual_seed(0)
    mha = MultiHeadAttention(256, 4).to("cuda", torch.float16).eval()
    x = torch.randn(2, 96, 256, device="cuda", dtype=torch.float16)
    with sdpa_kernel(_fast_backend()), torch.no_grad():
        out = mha(x, is_causal=True)
    with torch.no_grad():
        want = mha(x, mask=causal_mask(96, device="cuda"), need_weights=True)[0]
    torch.testing.assert_close(out, want, atol=2e-3, rtol=2e-3)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_attention_with_empty_rows_never_syncs_and_gives_zeros(dtype):
    q, k, v = _qkv(dtype, n=64)
    lengths = torch.tensor([64, 0], device="cuda")  # the second sequence has no key at all
    mask = padding_mask(lengths, 64)[:, None, None, :] & causal_mask(64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fused_attention(q, k, v, mask)
        causal = fused_attention(q, k, v, is_causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    want = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask)
    torch.testing.assert_close(out.float(), want, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(causal, fused_attention(q, k, v, causal_mask(64, device="cuda")),
                               atol=TOL[dtype], rtol=TOL[dtype])


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("fused", [True, False])
def test_parity_with_nn_multihead_attention_on_cuda(dtype, fused):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(64, 4, batch_first=True).to("cuda", dtype).eval()
    with torch.no_grad():
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    ours = MultiHeadAttention.from_torch(ref).eval()
    ours.fused = fused
    x = torch.randn(3, 33, 64, device="cuda", dtype=dtype)
    keep = padding_mask(torch.tensor([33, 20, 5], device="cuda"), 33)
    with fp32_matmuls(), torch.no_grad():
        want = ref(x, x, x, attn_mask=~causal_mask(33, device="cuda"), key_padding_mask=~keep,
                   need_weights=False)[0]
        got = ours(x, mask=keep[:, None, None, :], is_causal=True)
        got_masked = ours(x, mask=keep[:, None, None, :] & causal_mask(33, device="cuda"))
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(got_masked, want, atol=TOL[dtype], rtol=TOL[dtype])


@needs_cuda
def test_gradients_match_nn_multihead_attention_on_cuda():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(64, 4, batch_first=True).cuda()
    ours = MultiHeadAttention.from_torch(ref)
    x = torch.randn(2, 17, 64, device="cuda")
    with fp32_matmuls():
        ref(x, x, x, attn_mask=~causal_mask(17, device="cuda"), need_weights=False)[0].square().sum().backward()
        ours(x, is_causal=True).square().sum().backward()
    wq, wk, wv = ref.in_proj_weight.grad.chunk(3)
    for grad, proj in ((wq, ours.q_proj), (wk, ours.k_proj), (wv, ours.v_proj)):
        torch.testing.assert_close(proj.weight.grad, grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.out_proj.weight.grad, ref.out_proj.weight.grad, atol=1e-4, rtol=1e-4)
