"""CUDA pieces of the templates: the prelude (checks, block reductions) and output allocation.
Signatures, literals and input checks are the C++ ones (:mod:`.cpp`)."""

from __future__ import annotations

from modulelens.kernels.templates.call import TArg
from modulelens.kernels.templates.cpp import ATEN_DTYPE, ML_CHECK, ML_SHAPES, ilist

CUDA_SCALAR = {"float32": "float", "float16": "at::Half", "bfloat16": "at::BFloat16"}


CUDA_PRELUDE = """\
// modulelens: no-implicit-headers
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <tuple>
#include <vector>

ML_CHECK_BODY
ML_SHAPES_BODY
struct MlSum { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct MlMax { __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); } };

// All threads of the block get the reduction of v (blockDim.x a multiple of 32, at most 1024).
template <typename Op>
__device__ __forceinline__ float ml_block_allreduce(float v, Op op, float init) {
  __shared__ float shm[33];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) shm[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float w = lane < nw ? shm[lane] : init;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (lane == 0) shm[32] = w;
  }
  __syncthreads();
  return shm[32];
}
"""

CUDA_PRELUDE = (CUDA_PRELUDE.replace("ML_CHECK_BODY", ML_CHECK.replace("{DEVICE_TEST}", "t.is_cuda()")
                                     .replace("{DEVICE}", "CUDA")).replace("ML_SHAPES_BODY", ML_SHAPES))


def cuda_empty(t: TArg, like: str) -> str:
    return f"at::empty_strided({ilist(t.shape)}, {ilist(t.stride)}, {like}.options().dtype({ATEN_DTYPE[t.dtype]}))"
