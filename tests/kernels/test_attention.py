"""The Triton attention kernels (kernels/attention.py) under the interpreter, against float64
attention written out here: position p attends to positions <= p, query head h reads KV head
h // n_rep (HF's repeat_kv). Odd shapes (T 1, 7, 129, 600; S up to 4100; n_rep 1-5; head_dim
64 and 128), K/V read from a layer view of a multi-layer cache whose positions past S hold junk.
Mutants of the kernel source (causal offset one off, query heads mapped to KV heads the other
way round) must fail the same check. The engine's CUDA branch (forced on the CPU) runs them and
matches its sdpa path on the tiny fixture model."""
from __future__ import annotations

import importlib.util
import os
import sys
import time

import pytest
import torch

from support import FIXTURES
from tramontane.kernels import attention as attn
from tramontane.kernels.triton_compat import triton_usable

pytestmark = pytest.mark.skipif(not triton_usable(torch.device("cpu")) and not torch.cuda.is_available(),
                                reason="needs Triton (interpreter on CPU: TRITON_INTERPRET=1, see conftest)")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Max |kernel - float64| over max |float64 output|, for inputs in each dtype. The kernel rounds
# the output and the probabilities fed to P.V to the input dtype (bf16: 8 bits, fp16: 11 bits);
# observed: bf16 <= 4e-3, fp16 <= 5e-4, fp32 <= 5e-7.
TOL = {torch.bfloat16: 1e-2, torch.float16: 1.5e-3, torch.float32: 2e-6}
JUNK = 1e4  # in every cache position past the keys a call may read


def _cache(n_kv: int, keys: int, d: int, dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 1 of a (3 layers, n_kv, capacity, d) cache, as KVCache.layer_k views it: strided,
    at an offset; positions >= keys hold junk."""
    g = torch.Generator().manual_seed(seed)
    cap = keys + 37
    k = torch.randn(3, n_kv, cap, d, generator=g)
    v = torch.randn(3, n_kv, cap, d, generator=g)
    k[:, :, keys:] = JUNK
    v[:, :, keys:] = -JUNK
    return k.to(DEV, dtype)[1], v.to(DEV, dtype)[1]


def _queries(T: int, n_heads: int, d: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return (1.5 * torch.randn(T, n_heads, d, generator=g)).to(DEV, dtype)  # scores of a few units


def expected(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, start: int) -> torch.Tensor:
    """float64: row t is position start + t and sees positions 0..start + t; head h uses KV head
    h // n_rep. Loops over heads so nothing is broadcast or expanded the way the kernel is."""
    T, n_heads, d = q.shape
    n_rep = n_heads // cache_k.shape[0]
    pos = torch.arange(start, start + T)[:, None]
    key_pos = torch.arange(start + T)[None, :]
    out = torch.empty(T, n_heads, cache_v.shape[-1], dtype=torch.float64)
    for h in range(n_heads):
        k = cache_k[h // n_rep, :start + T].cpu().double()
        v = cache_v[h // n_rep, :start + T].cpu().double()
        s = q[:, h].cpu().double() @ k.T / d ** 0.5
        s = s.masked_fill(key_pos > pos, float("-inf"))
        out[:, h] = torch.softmax(s, -1) @ v
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.cpu().double() - ref).abs().max() / ref.abs().max())


# (T, start, kv heads, n_rep, head_dim, dtype): S = start + T from 1 to 4100
CASES = [
    (1, 0, 2, 4, 64, torch.bfloat16),
    (1, 4099, 1, 5, 128, torch.float16),
    (7, 0, 3, 1, 128, torch.bfloat16),
    (7, 3, 2, 3, 64, torch.float16),
    (7, 2990, 2, 2, 128, torch.bfloat16),
    (129, 0, 1, 2, 128, torch.float16),
    (129, 300, 2, 5, 64, torch.bfloat16),
    (33, 1000, 2, 2, 64, torch.float32),
    (600, 0, 1, 3, 64, torch.float16),
    (600, 3500, 1, 2, 128, torch.bfloat16),
]
MUTANT_CASES = [CASES[3], CASES[7]]  # T 7 over 10 keys; T 33 over 1033 (one key in 1000 shows)


def _case_id(c) -> str:
    T, start, n_kv, n_rep, d, dtype = c
    return f"T{T}-S{start + T}-kv{n_kv}-rep{n_rep}-d{d}-{str(dtype)[6:]}"


def _run_case(module, case, n_splits=None) -> float:
    T, start, n_kv, n_rep, d, dtype = case
    cache_k, cache_v = _cache(n_kv, start + T, d, dtype, seed=T + start)
    q = _queries(T, n_kv * n_rep, d, dtype, seed=T + start)
    out = module.attention(q, cache_k, cache_v, start, n_splits=n_splits)
    assert out.shape == (T, n_kv * n_rep, d) and out.dtype == dtype
    return rel_err(out, expected(q, cache_k, cache_v, start))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_prefill_matches_float64(case):
    t0 = time.perf_counter()
    err = _run_case(attn, case)
    assert err <= TOL[case[-1]], f"relative error {err:.2e}"
    print(f"{_case_id(case)}: rel err {err:.1e}, {time.perf_counter() - t0:.2f} s")


@pytest.mark.parametrize("n_splits", [1, 2, 5, 64])
def test_key_splits_agree(n_splits):
    """One program per row block, or keys split into ranges (ranges past a row's last key,
    ranges of a single block) merged by the combine kernel: the same answer."""
    case = (33, 250, 2, 3, 64, torch.float32)
    assert _run_case(attn, case, n_splits=n_splits) <= TOL[torch.float32]


@pytest.mark.parametrize("n_rep,head_dim,dtype", [(1, 128, torch.bfloat16), (4, 64, torch.float16),
                                                  (5, 128, torch.float32)])
def test_decode_reads_pos_on_device_and_hides_later_keys(n_rep, head_dim, dtype):
    """The CUDA-graph step: one launch shape for a bucket of 512 keys; positions past pos hold
    junk (stale rows of an earlier chat, the bucket's tail) that must not leak in."""
    n_kv, bucket = 2, 512
    cache_k, cache_v = _cache(n_kv, bucket, head_dim, dtype, seed=n_rep)
    for p in (0, 63, 64, 511):
        k, v = cache_k.clone(), cache_v.clone()
        k[:, p + 1:], v[:, p + 1:] = JUNK, -JUNK
        q = _queries(1, n_kv * n_rep, head_dim, dtype, seed=p)
        out = attn.decode_attention(q, k, v, torch.tensor([p], device=DEV), bucket)
        err = rel_err(out, expected(q, k, v, p))
        assert err <= TOL[dtype], f"pos {p}: relative error {err:.2e}"


def test_split_plan_fills_the_gpu_and_bounds_scratch(monkeypatch):
    monkeypatch.setattr(attn, "_sm_count", lambda device: 132)  # an H100 / H200
    cuda = torch.device("cuda")
    # decode: 8 KV heads x 1 row block at 4096 keys -> ~2 programs per SM, ranges of whole blocks
    n_splits, per = attn.split_plan(8, 4096, cuda)
    assert n_splits * 8 >= 2 * 132 - 8 and per % attn.BLOCK_N == 0 and (n_splits - 1) * per < 4096 <= n_splits * per
    # a long prefill fills the GPU with row blocks alone: no partials
    assert attn.split_plan(38 * 8, 4096, cuda) == (1, 4096)
    assert attn.split_plan(1, 10 ** 6, cuda)[0] <= attn.MAX_SPLITS


def test_scratch_is_bounded_by_rows_not_keys(monkeypatch):
    """What a call allocates (output + split partials, from the launch plan) stays under
    scratch_bytes, which the memory plan counts, at any key count up to 128k."""
    monkeypatch.setattr(attn, "_sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    dv, elem = 128, 2
    for n_kv in (1, 2, 8):
        for n_rep in (1, 4, 5):
            for T in (1, 2, 7, 16, 33, 100, 129, 600, 2048):
                bound = attn.scratch_bytes(T, n_kv * n_rep, n_kv, dv, elem, 132)
                assert bound <= T * n_kv * n_rep * dv * elem + 4 * 64 * 132 * (dv + 2) * 4
                for n_keys in (T, T + 255, 4100, 32768, 131072):
                    _, n_splits, _ = attn.launch_plan(T, n_rep, n_kv, n_keys, cuda)
                    used = T * n_kv * n_rep * dv * elem
                    if n_splits > 1:
                        used += n_splits * n_kv * T * n_rep * (dv + 2) * 4
                    assert used <= bound, (n_kv, n_rep, T, n_keys)


def _mutant(tmp_path, old: str, new: str):
    """kernels/attention.py with one line of the kernel changed, imported as its own module."""
    src = open(attn.__file__).read()
    assert src.count(old) == 1, f"mutation target moved: {old!r}"
    src = src.replace(old, new).replace("from .triton_compat import", "from tramontane.kernels.triton_compat import")
    path = tmp_path / f"attention_mutant_{abs(hash(new))}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # Triton's JIT looks the kernel's module up
    spec.loader.exec_module(module)
    return module


MUTANTS = {
    # row t sees one key more / one fewer than S - T + t
    "causal+1": ("last_key = S - T + t  #", "last_key = S - T + t + 1  #"),
    "causal-1": ("last_key = S - T + t  #", "last_key = S - T + t - 1  #"),
    # query head h on KV head h % n_kv (an interleaved repeat) instead of h // n_rep
    "kv-head": ("head = g * n_rep + m % n_rep\n    last_key", "head = g + (m % n_rep) * n_kv\n    last_key"),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
@pytest.mark.parametrize("case", MUTANT_CASES, ids=_case_id)
def test_the_check_catches_a_broken_kernel(tmp_path, mutant, case):
    """The same comparison fails for a shifted causal offset or the wrong KV head: the tests
    above (where these cases pass) are not blind to the bugs they are there for."""
    module = _mutant(tmp_path, *MUTANTS[mutant])
    err = _run_case(module, case)
    print(f"{mutant} {_case_id(case)}: relative error {err:.2e}")
    assert err > 10 * TOL[case[-1]], f"{mutant}: relative error {err:.2e} passes the check"


def test_bad_shapes_raise_value_error():
    k = torch.zeros(2, 16, 64)
    with pytest.raises(ValueError, match="do not fit"):
        attn.attention(torch.zeros(3, 3, 64), k, k, 0)
    with pytest.raises(ValueError, match="outside a cache of 16"):
        attn.attention(torch.zeros(3, 4, 64), k, k, 14)
    with pytest.raises(ValueError, match="one row"):
        attn.decode_attention(torch.zeros(2, 4, 64), k, k, torch.tensor([0]), 16)


def test_compile_specs_describe_the_real_launches():
    """COMPILE_SPECS (the offline compile check's list) names every kernel argument, in order,
    with the constexprs real launches pass for head_dim 128 in bf16 and fp16."""
    import inspect

    names = {attn._attention_kernel: list(inspect.signature(attn._attention_kernel.fn).parameters),
             attn._combine_kernel: list(inspect.signature(attn._combine_kernel.fn).parameters)}
    assert attn.COMPILE_SPECS
    for spec in attn.COMPILE_SPECS:
        assert list(spec["signature"]) == names[spec["kernel"]], spec["name"]
        assert {n for n, t in spec["signature"].items() if t == "constexpr"} == set(spec["constexprs"])
        assert set(spec["aligned"]) <= set(spec["signature"])
    seen = {(s["constexprs"].get("BLOCK_M"), s["constexprs"].get("POS_FROM_PTR"), s["constexprs"].get("SPLIT"),
             s["signature"]["o_ptr"]) for s in attn.COMPILE_SPECS}
    for dtype in ("*bf16", "*fp16"):
        for block_m, pos in ((attn.PREFILL_BLOCK_M, False), (attn.DECODE_BLOCK_M, False), (attn.DECODE_BLOCK_M, True)):
            for split in (False, True):
                assert (block_m, pos, split, dtype) in seen


# -------------------------------------------------------------------- the engine's CUDA branch

def test_prefill_attention_flash_matches_sdpa():
    """text.prefill_attention: the kernel (the CUDA choice) against the sdpa branch (the CPU
    float32 path), rows at start 0 and over cached keys, T = 1 included."""
    from tramontane.engine.mistral3.text import prefill_attention

    for T, start in ((1, 40), (9, 0), (9, 31)):
        cache_k, cache_v = _cache(2, start + T, 32, torch.float32, seed=start)
        q = _queries(T, 6, 32, torch.float32, seed=start)
        flash = prefill_attention(q, cache_k, cache_v, start, flash=True)
        sdpa = prefill_attention(q, cache_k, cache_v, start, flash=False)
        assert flash.shape == sdpa.shape == (T, 6 * 32)
        assert (flash - sdpa).abs().max().item() <= 1e-5


@pytest.fixture
def forced_flash(monkeypatch):
    """The engine's CUDA attention branch chosen or not, whatever the device (on the CPU the
    interpreter runs the kernels), the rest on the float32 torch path; counts the kernel calls."""
    from tramontane.engine.mistral3 import text

    calls = {"paged_attention": 0, "paged_decode_attention": 0}
    for name in calls:
        fn = getattr(attn, name)

        def counted(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(attn, name, counted)
    monkeypatch.setattr(text, "_native_f32", lambda *tensors: False)

    def use(on: bool):
        monkeypatch.setattr(text, "flash_attention_on", lambda device: on)

    return use, calls


def test_model_prefill_with_cached_kv_and_static_decode_match_sdpa_path(forced_flash, float32_cpu_path):
    """Tiny fixture model (f32, GQA 4 heads over 2): a 30-token prefill in chunks of 16 (the
    second over cached keys), 10 more rows over the cache (a reused-KV turn), then the CUDA-graph
    decode body at position 40 in a 64-key bucket. Triton branch vs sdpa branch: float32 logits
    within 1e-4 (observed ~1e-6)."""
    from tramontane.engine.mistral3.text import Mistral3Text
    from tramontane.engine.runtime.decoder import new_cache

    use, calls = forced_flash
    # the interpreter runs the kernels on CPU tensors; with a GPU the model sits there
    model = Mistral3Text.load(os.path.join(FIXTURES, "mistral3_tiny-f32.gguf"), device=DEV, dtype=torch.float32)
    model.prefill_chunk = 16
    ids = torch.randint(0, model.cfg.vocab_size, (41,), generator=torch.Generator().manual_seed(3))
    results = {}
    for on in (False, True):
        use(on)
        cache = new_cache(model, 64)
        first = model.logits(ids[:30], 0, cache, all_logits=True)
        reused = model.logits(ids[30:40], 30, cache, all_logits=True)
        cache.reserve(24)  # the table maps all 64 positions: stale rows the decode mask must hide
        last, row = divmod(41, cache.block)
        for ks in cache.pool.ks:
            ks[:, cache.blocks[last], :, row:] = JUNK
            ks[:, cache.blocks[last + 1:]] = JUNK
        tables = cache.table(torch.device(DEV))[None]
        step = model.decode_static(model.embed(ids[40:41]), torch.tensor([40], device=DEV), tables, cache, 64)
        results[on] = (first, reused, step)
    n_layers = model.cfg.n_layers
    assert calls == {"paged_attention": 3 * n_layers, "paged_decode_attention": n_layers}
    for sdpa, flash in zip(results[False], results[True]):
        err = (sdpa - flash).abs().max().item()
        print(f"Triton vs sdpa logits: max abs diff {err:.1e} (max |logit| {sdpa.abs().max().item():.2f})")
        assert err <= 1e-4


_TRITON_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64",
                 torch.int32: "*i32"}


def _launch_matches(spec: dict, args: tuple, kwargs: dict) -> bool:
    """Would an ahead-of-time build of this spec serve this launch? Every argument's type,
    every constexpr and launch option equal, every alignment claim true."""
    names = list(spec["signature"])
    bound = {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}
    for name, t in spec["signature"].items():
        value = bound[name]
        if t == "constexpr":
            ok = value == spec["constexprs"][name]
        elif t.startswith("*"):
            ok = isinstance(value, torch.Tensor) and _TRITON_TYPES.get(value.dtype) == t
        else:
            ok = isinstance(value, float) if t == "fp32" else isinstance(value, int) and -2 ** 31 <= value < 2 ** 31
        if not ok:
            return False
    aligned = all(bound[n].data_ptr() % 16 == 0 if isinstance(bound[n], torch.Tensor) else bound[n] % 16 == 0
                  for n in spec["aligned"])
    return (aligned and kwargs.get("num_warps") == spec["num_warps"]
            and kwargs.get("num_stages") == spec["num_stages"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_real_launch_has_a_compile_spec(monkeypatch, dtype):
    """The launches of a Mistral-Small-shaped layer (32 heads over 8, head_dim 128) on a
    132-SM GPU - a 2048-row chunk, a 600-row reused-KV turn, a 7-row turn, eager decode (T = 1)
    and the graph step - recorded, not run: each is served by a COMPILE_SPECS entry (the
    ahead-of-time build compiles exactly these)."""
    from tramontane.kernels import triton_compat

    launches = []
    monkeypatch.setattr(triton_compat, "_launch_hook", lambda *call: launches.append(call) or True)
    monkeypatch.setattr(attn, "_sm_count", lambda device: 132)
    monkeypatch.setattr(attn, "interpreting", lambda: False)  # as on the GPU
    layers = torch.zeros(2, 8, 8192, 128, dtype=dtype)
    cache_k, cache_v = layers[1], layers[0]
    for T, start in ((2048, 0), (600, 3000), (7, 4000), (1, 5000)):
        attn.attention(torch.zeros(T, 32, 128, dtype=dtype), cache_k, cache_v, start)
    attn.decode_attention(torch.zeros(1, 32, 128, dtype=dtype), cache_k, cache_v, torch.zeros(1, dtype=torch.long), 4096)
    kernels = [kernel for kernel, _, _, _ in launches]
    assert kernels.count(attn._attention_kernel) == 5 and attn._combine_kernel in kernels
    for kernel, grid, args, kwargs in launches:
        served = [s["name"] for s in attn.COMPILE_SPECS if s["kernel"] is kernel and _launch_matches(s, args, kwargs)]
        assert served, f"no COMPILE_SPECS entry serves {kernel.fn.__name__} grid {grid} {kwargs}"
