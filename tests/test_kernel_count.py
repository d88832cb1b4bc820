"""Kernels a compiled decode step launches, counted in Inductor's generated code: each policy's
bookkeeping fuses into the step's kernels instead of adding tens of small ones a layer (on a GPU
at small shapes, a step's time is its kernel count)."""
import pytest
import torch

from caches import POLICIES, make_cache_factory
from conftest import tiny_model
from engine.runtime.generation import Generator, compile_decode, decode_one_token
from engine.runtime.kernel_count import generated_code, launches, step_launches

LAYERS = 2
# Over full's step, a layer's compression may add this many launches: lagkv scores a whole
# lag partition at a pass (two kernels more on the CPU); every other policy fuses into the
# attention and cache writes it already has.
EXTRA_PER_LAYER = 2


def step_count(name: str) -> int:
    torch._dynamo.reset()
    model = tiny_model(n_layer=LAYERS)
    f = make_cache_factory(name, **({} if name == "full" else dict(cache_size=24, chunk=8)))
    gen = Generator(model, max_seq_length=256, make_cache=f)
    # The whole step, sampling included, as CUDA compiles it (here without CUDA graphs)
    gen.decode_fn = compile_decode(decode_one_token, model, caches=gen.caches, whole_step=True)
    with generated_code() as codes:
        gen.warmup(0.0, None)
    assert codes, "nothing compiled"
    return step_launches(codes)


@pytest.fixture(scope="module")
def full_step():
    n = step_count("full")
    # embedding, the head and sampling, and per layer its norms, projections and attention
    assert 0 < n <= 12 * LAYERS + 4, n
    return n


@pytest.mark.parametrize("name", [p for p in POLICIES if p != "full"])
def test_a_policy_adds_few_kernels_to_the_step(name, full_step):
    n = step_count(name)
    assert full_step <= n <= full_step + EXTRA_PER_LAYER * LAYERS, (name, n, full_step)


def test_launches_counts_triton_kernels_library_calls_and_nested_regions():
    """The GPU's wrapper code has Triton launches (`kernel.run(...)`) where the CPU's calls C++
    kernels; a nested region is a function called once a layer."""
    code = '''
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()
triton_poi_fused_add_0 = async_compile.triton('triton_poi_fused_add_0', "...")
triton_red_fused_mean_1 = async_compile.triton('triton_red_fused_mean_1', "...")
cpp_fused_embedding_2 = async_compile.cpp_pybinding(['float*'], "...")

def subgraph_0(args):
    a, b = args
    triton_red_fused_mean_1.run(a, b, 64, stream=0)
    extern_kernels.mm(a, b, out=a)
    buf = torch.ops.aten._scaled_dot_product_flash_attention.default(a, b, b)
    a.copy_(buf)
    return (a,)

class Runner:
    def call(self, args):
        a, b = args
        cpp_fused_embedding_2(a, b)
        x = subgraph_0([a, b])
        x = subgraph_0([a, b])
        x = subgraph_0([a, b])
        triton_poi_fused_add_0.run(a, b, 8, stream=0)
        return (a,)
'''
    assert launches(code) == 1 + 3 * 4 + 1
    assert step_launches([code, "class Runner:\n    def call(self, args):\n        pass\n"]) == 14
