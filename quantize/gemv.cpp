// regionkv::gemv(x, w, isa): y = x @ w^T for the one or two rows of a decode step's linears
// (quantize/gemv.py builds this file once per machine; docs/PERFORMANCE.md, section 6zd).
//
// A decode step reads every weight once for one row: memory bound, ~1 FLOP a byte. Each thread
// streams one contiguous band of W's rows, four rows at a time (four accumulators in flight, x
// read once for them), and prefetches the rows 8 KB ahead of its loads: on the pool's VMs the
// hardware prefetcher alone leaves a quarter of the bandwidth unused on these short rows.
// Products and sums are float32, the sum rounded once to the weight's dtype, as oneDNN does.
//
// Kernels by instruction set, each compiled for its own target and called only where the CPU has
// it (the op checks): 0 portable C++, 1 AVX2 + FMA, 2 AVX-512 BF16 (float32 weights: AVX2's).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

namespace {

using bf16 = c10::BFloat16;
constexpr int64_t kRows = 4;             // W rows a pass
constexpr int64_t kAheadBytes = 8192;    // prefetch distance along a band

inline float widen(bf16 v) { return static_cast<float>(v); }
inline float widen(float v) { return v; }

// The rows [r0, r1) of y[M, N] = x[M, K] W[N, K]^T in plain C++: the tails, and the reference.
template <int M, class T>
void rows_portable(const T* w, const T* x, T* y, int64_t N, int64_t K, int64_t r0, int64_t r1) {
  for (int64_t n = r0; n < r1; ++n) {
    for (int m = 0; m < M; ++m) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += widen(w[n * K + k]) * widen(x[m * K + k]);
      y[m * N + n] = static_cast<T>(s);
    }
  }
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

__attribute__((target("avx2,fma"))) inline void ahead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kAheadBytes, _MM_HINT_T0);
}

// AVX2, float32 weights: 8 lanes a load.
template <int M>
__attribute__((target("avx2,fma")))
void rows_avx2(const float* w, const float* x, float* y, int64_t N, int64_t K, int64_t r0,
               int64_t r1) {
  const int64_t K8 = K / 8 * 8;
  int64_t n = r0;
  for (; n + kRows <= r1; n += kRows) {
    __m256 acc[kRows][M];
    for (auto& a : acc) for (auto& v : a) v = _mm256_setzero_ps();
    const float* wn = w + n * K;
    for (int64_t k = 0; k < K8; k += 8) {
      __m256 xv[M];
      for (int m = 0; m < M; ++m) xv[m] = _mm256_loadu_ps(x + m * K + k);
      for (int r = 0; r < kRows; ++r) {
        if (k % 16 == 0) ahead(wn + r * K + k);  // one prefetch a 64-byte line
        __m256 wv = _mm256_loadu_ps(wn + r * K + k);
        for (int m = 0; m < M; ++m) acc[r][m] = _mm256_fmadd_ps(wv, xv[m], acc[r][m]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int m = 0; m < M; ++m) {
        float s = hsum(acc[r][m]);
        for (int64_t k = K8; k < K; ++k) s += wn[r * K + k] * x[m * K + k];
        y[m * N + n + r] = s;
      }
  }
  rows_portable<M>(w, x, y, N, K, n, r1);
}

// AVX2, bfloat16 weights, 16 a load without shuffles: a 32-bit lane holds elements 2i (low half)
// and 2i+1 (high half), so masking gives 2i+1 as a float and shifting gives 2i. x comes split
// into its even and odd elements, widened once (xe, xo: [M, K/2]).
template <int M>
__attribute__((target("avx2,fma")))
void rows_avx2(const bf16* w, const float* xe, const float* xo, const bf16* x, bf16* y,
               int64_t N, int64_t K, int64_t r0, int64_t r1) {
  const int64_t K16 = K / 16 * 16, H = K / 2;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  int64_t n = r0;
  for (; n + kRows <= r1; n += kRows) {
    __m256 acc[kRows][M], odd[kRows][M];  // even and odd elements: two chains, not one
    for (auto& a : acc) for (auto& v : a) v = _mm256_setzero_ps();
    for (auto& a : odd) for (auto& v : a) v = _mm256_setzero_ps();
    const bf16* wn = w + n * K;
    for (int64_t k = 0; k < K16; k += 16) {
      __m256 ev[M], od[M];
      for (int m = 0; m < M; ++m) {
        ev[m] = _mm256_loadu_ps(xe + m * H + k / 2);
        od[m] = _mm256_loadu_ps(xo + m * H + k / 2);
      }
      for (int r = 0; r < kRows; ++r) {
        if (k % 32 == 0) ahead(wn + r * K + k);
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wn + r * K + k));
        __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        for (int m = 0; m < M; ++m) {
          acc[r][m] = _mm256_fmadd_ps(lo, ev[m], acc[r][m]);
          odd[r][m] = _mm256_fmadd_ps(hi, od[m], odd[r][m]);
        }
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int m = 0; m < M; ++m) {
        float s = hsum(_mm256_add_ps(acc[r][m], odd[r][m]));
        for (int64_t k = K16; k < K; ++k) s += widen(wn[r * K + k]) * widen(x[m * K + k]);
        y[m * N + n + r] = static_cast<bf16>(s);
      }
  }
  rows_portable<M>(w, x, y, N, K, n, r1);
}

// AVX-512 BF16: one instruction multiplies 32 bfloat16 pairs and adds them into 16 floats.
template <int M>
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void rows_avx512bf16(const bf16* w, const bf16* x, bf16* y, int64_t N, int64_t K, int64_t r0,
                     int64_t r1) {
  const int64_t K32 = K / 32 * 32;
  int64_t n = r0;
  for (; n + kRows <= r1; n += kRows) {
    __m512 acc[kRows][M];
    for (auto& a : acc) for (auto& v : a) v = _mm512_setzero_ps();
    const bf16* wn = w + n * K;
    for (int64_t k = 0; k < K32; k += 32) {
      __m512bh xv[M];
      for (int m = 0; m < M; ++m) xv[m] = (__m512bh)_mm512_loadu_si512(x + m * K + k);
      for (int r = 0; r < kRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(wn + r * K + k) + kAheadBytes, _MM_HINT_T0);
        __m512bh wv = (__m512bh)_mm512_loadu_si512(wn + r * K + k);
        for (int m = 0; m < M; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv, xv[m]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int m = 0; m < M; ++m) {
        float s = _mm512_reduce_add_ps(acc[r][m]);
        for (int64_t k = K32; k < K; ++k) s += widen(wn[r * K + k]) * widen(x[m * K + k]);
        y[m * N + n + r] = static_cast<bf16>(s);
      }
  }
  rows_portable<M>(w, x, y, N, K, n, r1);
}

bool cpu_has(int64_t isa) {
  switch (isa) {
    case 0: return true;
    case 1: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case 2: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512bf16");
    default: return false;
  }
}

template <int M>
void run(const at::Tensor& x, const at::Tensor& w, at::Tensor& y, int64_t isa) {
  const int64_t N = w.size(0), K = w.size(1);
  // Bands of whole 4-row groups, one a thread (at::parallel_for splits the range evenly).
  const int64_t groups = (N + kRows - 1) / kRows;
  auto band = [&](auto&& rows) {
    at::parallel_for(0, groups, 16, [&](int64_t g0, int64_t g1) {
      rows(g0 * kRows, std::min(N, g1 * kRows));
    });
  };
  if (w.scalar_type() == at::kFloat) {
    const float *wp = w.data_ptr<float>(), *xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    if (isa == 0) band([&](int64_t a, int64_t b) { rows_portable<M>(wp, xp, yp, N, K, a, b); });
    else band([&](int64_t a, int64_t b) { rows_avx2<M>(wp, xp, yp, N, K, a, b); });
    return;
  }
  const bf16 *wp = w.data_ptr<bf16>(), *xp = x.data_ptr<bf16>();
  bf16* yp = y.data_ptr<bf16>();
  if (isa == 0) {
    band([&](int64_t a, int64_t b) { rows_portable<M>(wp, xp, yp, N, K, a, b); });
  } else if (isa == 2) {
    band([&](int64_t a, int64_t b) { rows_avx512bf16<M>(wp, xp, yp, N, K, a, b); });
  } else {
    std::vector<float> split(M * K);  // x's even elements, then its odd ones (K is even)
    float *ep = split.data(), *op = split.data() + M * K / 2;
    for (int64_t i = 0; i < M * K / 2; ++i) {
      ep[i] = widen(xp[2 * i]);
      op[i] = widen(xp[2 * i + 1]);
    }
    band([&](int64_t a, int64_t b) { rows_avx2<M>(wp, ep, op, xp, yp, N, K, a, b); });
  }
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, int64_t isa) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "regionkv::gemv: w must be a contiguous [N, K]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() &&
              (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "regionkv::gemv: x and w must both be float32 or both bfloat16");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(x.size(-1) == K, "regionkv::gemv: x has ", x.size(-1), " features, w ", K);
  const int64_t M = K ? x.numel() / K : 0;
  TORCH_CHECK(M == 1 || M == 2, "regionkv::gemv: x must hold 1 or 2 rows, not ", M);
  TORCH_CHECK(cpu_has(isa) && !(isa == 1 && w.scalar_type() == at::kBFloat16 && K % 2),
              "regionkv::gemv: kernel ", isa, " does not run here");
  at::Tensor xc = x.contiguous();
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, w.options());
  if (M == 1) run<1>(xc, w, y, isa);
  else run<2>(xc, w, y, isa);
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(regionkv, CPU, m) { m.impl("gemv", gemv); }
