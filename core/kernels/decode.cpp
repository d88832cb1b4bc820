// The engine's own CPU kernels for a compiled decode step (kernels/__init__.py builds this file
// once per machine):
//   regionkv::gemv(x, w, isa)      y = x @ w^T for the 1-8 rows of a step's linears (a decode
//                                   step's batch, a verify step's tokens), the weight read once
//   regionkv::scores(q, k, isa)    q . k for a few query rows over a stretch of cached keys
//   regionkv::mix(p, v, isa)       p @ v: attention's weights over a stretch of cached values
//   regionkv::scores8 / mix8        the same over an INT8 stretch (codes four to a word, per-slot
//                                   scales: quantize/kv.py), its scale applied as it is read
//   regionkv::attend(q, [k], [v], ...)  softmax(q . k * scale, masked) @ v over a view's
//                                   stretches (each float32, bfloat16 or INT8) in one call, and
//                                   each row's log-sum-exp
//
// A decode step reads every weight once for one row: memory bound, ~1 FLOP a byte. Each thread
// streams one contiguous band of W's rows and prefetches it 8 KB ahead of its loads (on the
// pool's VMs the hardware prefetcher alone leaves a quarter of the bandwidth unused on these
// short rows): AVX2 a row at a time, one sequential stream (machine D's memory serves four rows
// in flight, four streams, 15-29% slower); AVX-512 BF16 the same on AMD CPUs and four rows at a
// time, x read once for them, on Intel's (one_stream).
// Attention reads each cached key and value once for all the query rows of its head (the
// reductions Inductor writes for it read a key once per row and sum across lanes per row); its
// loops take a reader of the stretch as stored (Rows<T>, Codes), one loop for float32,
// bfloat16 and INT8 keys or values.
// Products and sums are float32; gemv rounds its sums once to the weight's dtype, as oneDNN
// does; scores and mix return float32.
//
// Kernels by instruction set, each compiled for its own target and called only where the CPU has
// it (the ops check): 0 portable C++, 1 AVX2 + FMA, 2 AVX-512 with BF16 (a float32 GEMV or
// scores there take AVX2's form: memory bound either way).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include <immintrin.h>

namespace {

#define REGIONKV_INLINE inline __attribute__((always_inline))  // takes its caller's target
using bf16 = c10::BFloat16;
constexpr int64_t kRows = 4;             // a band's unit; the AVX-512 loop's rows (Intel)
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

// A weight is read once a step, and the model is many times the last-level cache: on a CPU
// with AVX2 alone the AVX2 loops prefetch it non-temporally (NTA, `once`: into L1, not left in
// L2 / L3 for other data to be evicted by), 7-10% faster than T0 on machine D. On AVX-512 CPUs, where float32 weights take the AVX2 loop too, T0: NTA there read a
// step's float32 weights at 11 GB/s against 24-26 with T0 on machine E (Intel). One rule for the weights and attention's reads (read_once).
inline bool non_temporal(int64_t isa) { return isa == 1; }

template <bool once>
__attribute__((target("avx2,fma"))) inline void ahead(const void* p) {
  if constexpr (once) _mm_prefetch(static_cast<const char*>(p) + kAheadBytes, _MM_HINT_NTA);
  else _mm_prefetch(static_cast<const char*>(p) + kAheadBytes, _MM_HINT_T0);
}

// AVX2, float32 weights, one row at a time, as bfloat16's below (one sequential stream a
// thread; a float32 step ~5% faster than with four rows in flight on machine D): a line an
// iteration, in two chains a row of x.
template <int M>
__attribute__((target("avx2,fma")))
REGIONKV_INLINE void eight(const float* wk, const float* x, int64_t K, __m256 (&acc)[M][2],
                           int c) {  // 8 lanes of a row into chain c
  const __m256 wv = _mm256_loadu_ps(wk);
  for (int m = 0; m < M; ++m)
    acc[m][c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * K), acc[m][c]);
}

template <int M, bool once>
__attribute__((target("avx2,fma")))
void rows_avx2(const float* w, const float* x, float* y, int64_t N, int64_t K, int64_t r0,
               int64_t r1) {
  const int64_t K16 = K / 16 * 16, K8 = K / 8 * 8;
  for (int64_t n = r0; n < r1; ++n) {
    const float* wn = w + n * K;
    __m256 acc[M][2];
    for (auto& a : acc) for (auto& v : a) v = _mm256_setzero_ps();
    for (int64_t k = 0; k < K16; k += 16) {
      ahead<once>(wn + k);
      eight<M>(wn + k, x + k, K, acc, 0);
      eight<M>(wn + k + 8, x + k + 8, K, acc, 1);
    }
    if (K8 > K16) eight<M>(wn + K16, x + K16, K, acc, 0);
    for (int m = 0; m < M; ++m) {
      float s = hsum(_mm256_add_ps(acc[m][0], acc[m][1]));
      for (int64_t k = K8; k < K; ++k) s += wn[k] * x[m * K + k];
      y[m * N + n] = s;
    }
  }
}

// AVX2, bfloat16 weights, one row at a time: a thread's band is one sequential stream (four
// rows in flight are four streams, which machine D's memory serves 15-29% slower for
// bfloat16's short rows), a 64-byte line an iteration. 16 elements a load without
// shuffles: a 32-bit lane holds elements 2i (low half) and 2i+1 (high half), so masking gives
// 2i+1 as a float and shifting gives 2i. x comes split into its even and odd elements, widened
// once (xe, xo: [M, K/2]). Four chains a row of x: a line's two halves, even and odd.
template <int M>
__attribute__((target("avx2,fma")))
REGIONKV_INLINE void half_line(const bf16* wk, const float* xe, const float* xo, int64_t H,
                               __m256 (&acc)[M][4], int c) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk));
  const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  const __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(v, high));
  for (int m = 0; m < M; ++m) {
    acc[m][2 * c] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xe + m * H), acc[m][2 * c]);
    acc[m][2 * c + 1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xo + m * H), acc[m][2 * c + 1]);
  }
}

template <int M, bool once>
__attribute__((target("avx2,fma")))
void rows_avx2(const bf16* w, const float* xe, const float* xo, const bf16* x, bf16* y,
               int64_t N, int64_t K, int64_t r0, int64_t r1) {
  const int64_t K32 = K / 32 * 32, K16 = K / 16 * 16, H = K / 2;
  for (int64_t n = r0; n < r1; ++n) {
    const bf16* wn = w + n * K;
    __m256 acc[M][4];
    for (auto& a : acc) for (auto& v : a) v = _mm256_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {
      ahead<once>(wn + k);
      half_line<M>(wn + k, xe + k / 2, xo + k / 2, H, acc, 0);
      half_line<M>(wn + k + 16, xe + k / 2 + 8, xo + k / 2 + 8, H, acc, 1);
    }
    if (K16 > K32) half_line<M>(wn + K32, xe + K32 / 2, xo + K32 / 2, H, acc, 0);
    for (int m = 0; m < M; ++m) {
      float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[m][0], acc[m][1]),
                                   _mm256_add_ps(acc[m][2], acc[m][3])));
      for (int64_t k = K16; k < K; ++k) s += widen(wn[k]) * widen(x[m * K + k]);
      y[m * N + n] = static_cast<bf16>(s);
    }
  }
}

// AVX-512 BF16: one instruction multiplies 32 bfloat16 pairs and adds them into 16 floats.
// R rows in flight (one_stream): four, x read once for them, or one, a thread's band one
// sequential stream as in the AVX2 loops, a lone row's sums alternating two chains (C) so that
// the instruction's latency is hidden.
template <int M, int R, int C>
__attribute__((target("avx512f,avx512bw,avx512bf16")))
REGIONKV_INLINE void dot32(const bf16* wn, const bf16* x, int64_t K, int64_t k,
                           __m512 (&acc)[C][R][M], int c) {  // 32 columns of R rows, chain c
  __m512bh xv[M];
  for (int m = 0; m < M; ++m) xv[m] = (__m512bh)_mm512_loadu_si512(x + m * K + k);
  for (int r = 0; r < R; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(wn + r * K + k) + kAheadBytes, _MM_HINT_T0);
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(wn + r * K + k);
    for (int m = 0; m < M; ++m) acc[c][r][m] = _mm512_dpbf16_ps(acc[c][r][m], wv, xv[m]);
  }
}

template <int M, int R>
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void rows_avx512bf16(const bf16* w, const bf16* x, bf16* y, int64_t N, int64_t K, int64_t r0,
                     int64_t r1) {
  constexpr int C = R == 1 ? 2 : 1;
  const int64_t K32 = K / 32 * 32;
  int64_t n = r0;
  for (; n + R <= r1; n += R) {
    __m512 acc[C][R][M];
    for (auto& a : acc) for (auto& b : a) for (auto& v : b) v = _mm512_setzero_ps();
    const bf16* wn = w + n * K;
    int64_t k = 0;
    for (; k + 32 * C <= K32; k += 32 * C)
      for (int c = 0; c < C; ++c) dot32<M, R, C>(wn, x, K, k + 32 * c, acc, c);
    for (; k < K32; k += 32) dot32<M, R, C>(wn, x, K, k, acc, 0);
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) {
        __m512 sum = acc[0][r][m];
        for (int c = 1; c < C; ++c) sum = _mm512_add_ps(sum, acc[c][r][m]);
        float s = _mm512_reduce_add_ps(sum);
        for (int64_t k = K32; k < K; ++k) s += widen(wn[r * K + k]) * widen(x[m * K + k]);
        y[m * N + n + r] = static_cast<bf16>(s);
      }
  }
  rows_portable<M>(w, x, y, N, K, n, r1);
}

// Whether the AVX-512 BF16 loop reads a row at a time. AMD's cores read a band fastest as one
// stream: machine B (Zen 4) ran a step's bfloat16 GEMVs at 31-32 GB/s a row at a time against
// 21-23 with four rows, as machine D did its AVX2 loops. Intel's keep
// four, what machine C met its targets with; on E the two were level or four ahead.
inline bool one_stream() {
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
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
    else if (non_temporal(isa))
      band([&](int64_t a, int64_t b) { rows_avx2<M, true>(wp, xp, yp, N, K, a, b); });
    else band([&](int64_t a, int64_t b) { rows_avx2<M, false>(wp, xp, yp, N, K, a, b); });
    return;
  }
  const bf16 *wp = w.data_ptr<bf16>(), *xp = x.data_ptr<bf16>();
  bf16* yp = y.data_ptr<bf16>();
  if (isa == 0) {
    band([&](int64_t a, int64_t b) { rows_portable<M>(wp, xp, yp, N, K, a, b); });
  } else if (isa == 2 && one_stream()) {
    band([&](int64_t a, int64_t b) { rows_avx512bf16<M, 1>(wp, xp, yp, N, K, a, b); });
  } else if (isa == 2) {
    band([&](int64_t a, int64_t b) { rows_avx512bf16<M, kRows>(wp, xp, yp, N, K, a, b); });
  } else {
    std::vector<float> split(M * K);  // x's even elements, then its odd ones (K is even)
    float *ep = split.data(), *op = split.data() + M * K / 2;
    for (int64_t i = 0; i < M * K / 2; ++i) {
      ep[i] = widen(xp[2 * i]);
      op[i] = widen(xp[2 * i + 1]);
    }
    // kernel 1 alone reaches here (kernel 2 has the AVX-512 BF16 loop): non_temporal(1)
    band([&](int64_t a, int64_t b) { rows_avx2<M, true>(wp, ep, op, xp, yp, N, K, a, b); });
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
  TORCH_CHECK(M >= 1 && M <= 8, "regionkv::gemv: x must hold 1 to 8 rows, not ", M);
  TORCH_CHECK(cpu_has(isa) && !(isa == 1 && w.scalar_type() == at::kBFloat16 && K % 2),
              "regionkv::gemv: kernel ", isa, " does not run here");
  at::Tensor xc = x.contiguous();
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, w.options());
  switch (M) {  // a row per sum chain: every row's sums from one read of the weight
    case 1: run<1>(xc, w, y, isa); break;
    case 2: run<2>(xc, w, y, isa); break;
    case 3: run<3>(xc, w, y, isa); break;
    case 4: run<4>(xc, w, y, isa); break;
    case 5: run<5>(xc, w, y, isa); break;
    case 6: run<6>(xc, w, y, isa); break;
    case 7: run<7>(xc, w, y, isa); break;
    default: run<8>(xc, w, y, isa);
  }
  return y;
}

// ---- attention over a stretch of cached slots: q [B, H, M, D], k / v [B, H, S, D] ----------
// Strided over B, H and S (a stretch is a slice of a cache's buffer), D contiguous. Work is cut
// into (b, h, block of kSlots slots; attend's by attend_slots) pieces, spread over the threads.
constexpr int64_t kSlots = 128;

struct Stretch {  // one (b, h) of a [B, H, S, D] tensor: element (s, d) at p + s * ss + d
  const void* p; int64_t ss;
};

inline Stretch stretch(const at::Tensor& t, int64_t bh, int64_t elem) {
  const int64_t H = t.size(1), b = bh / H, h = bh % H;
  return {static_cast<const char*>(t.data_ptr()) + (b * t.stride(0) + h * t.stride(1)) * elem,
          t.stride(2)};
}

// Slot s + ahead(...) of a stretch walked in slot order, each of its cache lines: as for the
// weights, the hardware's prefetcher alone leaves bandwidth unused. once: the call reads each
// of those lines once (read_once), so it comes in non-temporally, as the GEMV's weights do.
inline int64_t ahead_rows(int64_t D, int64_t elem) {
  return std::max<int64_t>(1, kAheadBytes / (D * elem));
}
inline __attribute__((always_inline)) void prefetch_row(const void* row, int64_t bytes,
                                                       bool once) {
  const char* p = static_cast<const char*>(row);
  if (once) for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 0);
  else for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

// Whether AVX2's loops read each line of a float stretch once for M query rows: scores takes
// three rows a pass and mix kOnceRows rows of a pass's columns (its passes split the row's
// lines; avx2 checks its passes against this). The GQA group of a decode step at batch 1 is 3
// rows on the default model. INT8 rows are re-read (mix's passes take half a line each), and
// AVX-512 keeps T0: unmeasured there.
constexpr int64_t kOnceRows = 3;
inline bool read_once(int64_t isa, int64_t M) { return non_temporal(isa) && M <= kOnceRows; }

// ---- what a stretch holds: the readers every attention loop takes --------------------------
// Rows<T>: float32 or bfloat16 keys or values. Codes: an INT8 stretch, a slot's D codes in D/4
// words, code i * D/4 + j in byte i of word j (quantize/kv.py), so the row's bytes in memory
// order are the codes in "byte order": byte 4j + i is code i * D/4 + j. The kernels work in
// byte order, the query permuted into it going in and the mixed values permuted out of it at
// the end, and scale each slot's sums once.
// A reader: row(s), slot s's row; from(c), the same stretch from column c (a pass over part of
// the rows); skip(s), the stretch from slot s (a block of it); at(r, d), column d of a row in
// float32; scale(s), what slot s's products are multiplied by; kElem, bytes an element.
template <class T>
struct Rows {
  static constexpr int64_t kElem = sizeof(T);
  Stretch k;
  bool once = false;  // each line read once by this call (prefetch_row)
  const T* row(int64_t s) const { return static_cast<const T*>(k.p) + s * k.ss; }
  Rows from(int64_t c) const { return {{row(0) + c, k.ss}, once}; }
  Rows skip(int64_t s) const { return {{row(s), k.ss}, once}; }
  static float at(const T* r, int64_t d) { return widen(r[d]); }
  static float scale(int64_t) { return 1.f; }
};

struct Codes {
  static constexpr int64_t kElem = 1;
  static constexpr bool once = false;
  Stretch w, sc;  // w.ss counts 4-byte words
  const int8_t* row(int64_t s) const { return static_cast<const int8_t*>(w.p) + 4 * s * w.ss; }
  Codes from(int64_t c) const { return {{row(0) + c, w.ss}, sc}; }
  Codes skip(int64_t s) const {
    return {{row(s), w.ss}, {static_cast<const float*>(sc.p) + s * sc.ss, sc.ss}};
  }
  static float at(const int8_t* r, int64_t d) { return r[d]; }
  float scale(int64_t s) const { return static_cast<const float*>(sc.p)[s * sc.ss]; }
};

inline int64_t byte_of(int64_t d, int64_t D) { return 4 * (d % (D / 4)) + d / (D / 4); }

// The portable forms (kernel 0, and the head sizes the vector loops do not take).
// scores: out[m, s] = scale(s) q[m] . k[s] for the slots [s0, s1), out float32 [M, S] of this
// (b, h), q float32 [M, D].
template <class K>
void scores_portable(const float* q, K k, float* out, int64_t M, int64_t S, int64_t D,
                     int64_t s0, int64_t s1) {
  const int64_t A = ahead_rows(D, K::kElem);
  for (int64_t s = s0; s < s1; ++s) {
    const auto r = k.row(s);
    prefetch_row(k.row(s + A), D * K::kElem, k.once);
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.f;
      for (int64_t d = 0; d < D; ++d) acc += q[m * D + d] * K::at(r, d);
      out[m * S + s] = acc * k.scale(s);
    }
  }
}

// mix: acc[m, :] = sum over the slots [s0, s1) of p[m, s] scale(s) v[s, :], acc float32 [M, D].
template <class K>
void mix_portable(const float* p, K v, float* acc, int64_t M, int64_t S, int64_t D, int64_t s0,
                  int64_t s1) {
  std::fill(acc, acc + M * D, 0.f);
  const int64_t A = ahead_rows(D, K::kElem);
  for (int64_t s = s0; s < s1; ++s) {
    const auto r = v.row(s);
    prefetch_row(v.row(s + A), D * K::kElem, v.once);
    for (int64_t m = 0; m < M; ++m) {
      const float w = p[m * S + s] * v.scale(s);
      for (int64_t d = 0; d < D; ++d) acc[m * D + d] += w * K::at(r, d);
    }
  }
}

// An INT8 stretch's rows [s0, s1) as values in T (float32, bfloat16): out[s, i * D/4 + j] =
// byte i of word j times the slot's scale, bfloat16 rounded to nearest even. Plain loops over
// the words, which GCC vectorizes for the target of the function it is inlined into (widen).
template <class T>
REGIONKV_INLINE void widen_rows(Codes w, T* out, int64_t D, int64_t s0, int64_t s1) {
  const int64_t Q = D / 4;
  for (int64_t s = s0; s < s1; ++s) {
    const int32_t* x = reinterpret_cast<const int32_t*>(w.row(s));
    const float scale = w.scale(s);
    T* o = out + s * D;
    for (int i = 0; i < 4; ++i)
      for (int64_t j = 0; j < Q; ++j) {
        const float v = static_cast<float>((x[j] << (24 - 8 * i)) >> 24) * scale;
        if constexpr (sizeof(T) == 4) {
          o[i * Q + j] = v;
        } else {
          uint32_t b;
          __builtin_memcpy(&b, &v, 4);
          const uint16_t h = static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
          __builtin_memcpy(o + i * Q + j, &h, 2);
        }
      }
  }
}

// weigh (the attend op's weights over a block; kernels/attention.h) one slot at a time.
void weigh_portable(float* s, const uint8_t* mask, int64_t mt, int64_t T, int64_t M, int64_t n,
                    float scale, float* mx, float* l) {
  for (int64_t m = 0; m < M; ++m) {
    float* x = s + m * n;
    const uint8_t* keep = mask + m % T * mt;
    float t = -INFINITY;
    for (int64_t i = 0; i < n; ++i) t = std::max(t, x[i] = keep[i] ? x[i] * scale : -INFINITY);
    float total = 0.f;
    for (int64_t i = 0; i < n; ++i) total += x[i] = t == -INFINITY ? 0.f : std::exp(x[i] - t);
    mx[m] = t;
    l[m] = total;
  }
}

// Float vectors in GCC's vector extension, as wide as the target's registers: 8 lanes (AVX2,
// ymm) or 16 (AVX-512, zmm), the same code compiled for each.
typedef float f8 __attribute__((vector_size(32)));
typedef float f16 __attribute__((vector_size(64)));

// The vector loops, compiled once per target: each namespace defines F (the float vector), L
// (its lanes), lanes(p) for bfloat16 values and INT8 codes (L of them widened to float32 by the
// target's intrinsics), the rows and columns of a mix pass for head sizes 64 and 128
// (kRows64/128, kPass64/128), then includes the loops that both targets share
// (kernels/attention.h: mix over any reader, lanes of float32), all under the target's
// `#pragma GCC target`: GCC's generic widening of int8 lanes comes out element by element and
// of bfloat16 in 128-bit halves, so the loops inline the target's intrinsics, and those inline
// only into code of their target.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using F = f8;
constexpr int L = 8, kRows64 = 3, kRows128 = 3, kPass64 = 4, kPass128 = 4;
static_assert(kOnceRows <= 3 && kRows64 >= kOnceRows && kRows128 >= kOnceRows,
              "read_once: scores (scores_by_three) and mix take kOnceRows rows in one pass");
REGIONKV_INLINE F lanes(const bf16* p) {  // bfloat16: float32's high half
  return (F)_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
}
REGIONKV_INLINE F lanes(const int8_t* p) {
  return (F)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#include "attention.h"

// Four slots' sums of one row, one lane each: [sum a, sum b, sum c, sum d].
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// scores for R query rows over four slots at a time: each key vector widened once for the R
// rows, the 4 x R sums in registers (R <= 3: 12 of the 16), reduced four slots to a store.
// kTail: the head size is not a multiple of 8, each sum finishes lane by lane (a loop of its
// own: the branch would keep GCC from holding the sums in registers past the loop).
template <int R, bool kTail, class K>
REGIONKV_INLINE void scores_rows(const float* qf, const K k, float* out, int64_t S, int64_t D,
                                 int64_t s0, int64_t s1) {
  const int64_t D8 = D / 8 * 8, A = ahead_rows(D, K::kElem);
  int64_t s = s0;
  for (; s + 4 <= s1; s += 4) {
    decltype(k.row(s)) ks[4];
    for (int j = 0; j < 4; ++j) {
      ks[j] = k.row(s + j);
      prefetch_row(k.row(s + j + A), D * K::kElem, k.once);
    }
    __m256 acc[R][4];
    for (auto& a : acc) for (auto& v : a) v = _mm256_setzero_ps();
    for (int64_t d = 0; d < D8; d += 8)
      for (int j = 0; j < 4; ++j) {
        const __m256 kv = (__m256)lanes(ks[j] + d);
        for (int r = 0; r < R; ++r)
          acc[r][j] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(qf + r * D + d), acc[r][j]);
      }
    const __m128 c = _mm_setr_ps(k.scale(s), k.scale(s + 1), k.scale(s + 2), k.scale(s + 3));
    for (int r = 0; r < R; ++r) {
      __m128 v = hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
      if constexpr (kTail) {  // the lanes past the last 8, one at a time
        alignas(16) float t[4];
        _mm_store_ps(t, v);
        for (int j = 0; j < 4; ++j)
          for (int64_t d = D8; d < D; ++d) t[j] += qf[r * D + d] * K::at(ks[j], d);
        v = _mm_load_ps(t);
      }
      _mm_storeu_ps(out + r * S + s, _mm_mul_ps(v, c));  // Rows' scale 1 folds away
    }
  }
  for (; s < s1; ++s) {  // the last slots of the range, one at a time
    const auto ks = k.row(s);
    for (int r = 0; r < R; ++r) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t d = 0; d < D8; d += 8)
        acc = _mm256_fmadd_ps((__m256)lanes(ks + d), _mm256_loadu_ps(qf + r * D + d), acc);
      float v = hsum(acc);
      for (int64_t d = D8; d < D; ++d) v += qf[r * D + d] * K::at(ks, d);
      out[r * S + s] = v * k.scale(s);
    }
  }
}

template <bool kTail, class K>
void scores_by_three(const float* qf, const K k, float* out, int64_t M, int64_t S, int64_t D,
                     int64_t s0, int64_t s1) {
  for (int64_t m = 0; m < M; m += 3) {  // three rows a pass, then the rest
    const float* q = qf + m * D;
    float* o = out + m * S;
    if (M - m >= 3) scores_rows<3, kTail>(q, k, o, S, D, s0, s1);
    else if (M - m == 2) scores_rows<2, kTail>(q, k, o, S, D, s0, s1);
    else scores_rows<1, kTail>(q, k, o, S, D, s0, s1);
  }
}

// AVX2's scores over any stored keys (float32, bfloat16, INT8): the query in float32 (qf
// [M, D]; an INT8 stretch's in byte order).
template <class K>
void scores(const float* qf, const K k, float* out, int64_t M, int64_t S, int64_t D,
            int64_t s0, int64_t s1) {
  if (D % 8) scores_by_three<true>(qf, k, out, M, S, D, s0, s1);
  else scores_by_three<false>(qf, k, out, M, S, D, s0, s1);
}
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
namespace avx512 {
using F = f16;
constexpr int L = 16, kRows64 = 4, kRows128 = 2, kPass64 = 4, kPass128 = 8;
REGIONKV_INLINE F lanes(const bf16* p) {
  return (F)_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
}
REGIONKV_INLINE F lanes(const int8_t* p) {
  return (F)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#include "attention.h"

// scores four slots at a time: a score is a 16-lane sum, and reducing each one alone (9
// instructions, a chain of 8) cost more than its products; four slots' sums of a row fold
// into one vector, four rows' into one more, stored a row's four scores at a time. fold4: a row's sums over slots a-d -> 128-bit lane j, four partial sums of slot j.
REGIONKV_INLINE __m512 fold4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44),
                                  _mm512_shuffle_f32x4(a, b, 0xee));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44),
                                  _mm512_shuffle_f32x4(c, d, 0xee));
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
}

// Four rows' folds -> lane r (of four floats) holds row r's scores of the four slots.
REGIONKV_INLINE __m512 sum4(__m512 p0, __m512 p1, __m512 p2, __m512 p3) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(p0, p1), _mm512_unpackhi_ps(p0, p1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(p2, p3), _mm512_unpackhi_ps(p2, p3));
  const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44),
                                 _mm512_shuffle_ps(t0, t1, 0xee));  // lane j: slot j's rows
  return _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), u);
}

// Four slots' scores of R <= 4 rows from their sums acc[r][n] (row r, slot n), each times
// lane n of scale (kScaled; else 1), stored at out [R, S].
template <int R, bool kScaled>
REGIONKV_INLINE void put4(const __m512 (&acc)[4][4], __m128 scale, float* out, int64_t S) {
  __m512 p[4];
  for (int r = 0; r < 4; ++r)
    p[r] = r < R ? fold4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]) : _mm512_setzero_ps();
  __m512 v = sum4(p[0], p[1], p[2], p[3]);
  if constexpr (kScaled) v = _mm512_mul_ps(v, _mm512_broadcast_f32x4(scale));
  _mm_storeu_ps(out, _mm512_castps512_ps128(v));
  if constexpr (R > 1) _mm_storeu_ps(out + S, _mm512_extractf32x4_ps(v, 1));
  if constexpr (R > 2) _mm_storeu_ps(out + 2 * S, _mm512_extractf32x4_ps(v, 2));
  if constexpr (R > 3) _mm_storeu_ps(out + 3 * S, _mm512_extractf32x4_ps(v, 3));
}

// R rows' scores over four INT8 slots k[n] (scales: lane n of sc), D = L * V: each slot's
// vector of codes widened once for the rows.
template <int R, int V>
REGIONKV_INLINE void codes4(const float* q, const int8_t* const (&k)[4], __m128 sc, float* out,
                            int64_t S) {
  constexpr int D = L * V;
  __m512 acc[4][4];
  for (auto& a : acc) for (auto& v : a) v = _mm512_setzero_ps();
  for (int j = 0; j < V; ++j)
    for (int n = 0; n < 4; ++n) {
      const __m512 kv = (__m512)lanes(k[n] + L * j);
      for (int r = 0; r < R; ++r)
        acc[r][n] = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q + r * D + L * j), acc[r][n]);
    }
  put4<R, true>(acc, sc, out, S);
}

// scores over INT8 codes for D = L * V: the query float32 in byte order, four slots at a time
// for the rows in fours (slots past the last four one at a time).
template <int V>
REGIONKV_INLINE void scores_rows(const float* qb, Codes w, float* out, int64_t M, int64_t S,
                                 int64_t s0, int64_t s1) {
  constexpr int D = L * V;
  const int64_t A = ahead_rows(D, 1);
  int64_t s = s0;
  for (; s + 4 <= s1; s += 4) {
    const int8_t* k[4];
    for (int n = 0; n < 4; ++n) {
      k[n] = w.row(s + n);
      prefetch_row(w.row(s + n + A), D, w.once);
    }
    // The scales straight into a register: stored to the stack as a float[4] and read back as
    // a vector, they stalled on store forwarding (a fifth of this loop's time on machine B).
    const __m128 sc = _mm_setr_ps(w.scale(s), w.scale(s + 1), w.scale(s + 2), w.scale(s + 3));
    for (int64_t m = 0; m < M; m += 4) {
      const float* q = qb + m * D;
      float* o = out + m * S + s;
      switch (std::min<int64_t>(4, M - m)) {
        case 4: codes4<4, V>(q, k, sc, o, S); break;
        case 3: codes4<3, V>(q, k, sc, o, S); break;
        case 2: codes4<2, V>(q, k, sc, o, S); break;
        default: codes4<1, V>(q, k, sc, o, S);
      }
    }
  }
  for (; s < s1; ++s) {
    const int8_t* r = w.row(s);
    F kv[V];
    for (int j = 0; j < V; ++j) kv[j] = lanes(r + L * j);
    for (int64_t m = 0; m < M; ++m) {
      F acc = lanes(qb + m * D) * kv[0];
      for (int j = 1; j < V; ++j) acc += lanes(qb + m * D + L * j) * kv[j];
      out[m * S + s] = _mm512_reduce_add_ps((__m512)acc) * w.scale(s);
    }
  }
}

void scores(const float* qb, Codes w, float* out, int64_t M, int64_t S, int64_t D, int64_t s0,
            int64_t s1) {
  if (D == 64) scores_rows<64 / L>(qb, w, out, M, S, s0, s1);
  else if (D == 128) scores_rows<128 / L>(qb, w, out, M, S, s0, s1);
  else scores_portable(qb, w, out, M, S, D, s0, s1);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16")
// AVX-512 BF16: one instruction multiplies 32 bfloat16 pairs of a key row and the query and
// adds them into 16 floats. R rows' scores over four bfloat16 slots k[n], D = 32 * V.
template <int R, int V>
REGIONKV_INLINE void pairs4(const bf16* q, const bf16* const (&k)[4], float* out, int64_t S) {
  constexpr int D = 32 * V;
  __m512 acc[4][4];
  for (auto& a : acc) for (auto& v : a) v = _mm512_setzero_ps();
  for (int j = 0; j < V; ++j)
    for (int n = 0; n < 4; ++n) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(k[n] + 32 * j);
      for (int r = 0; r < R; ++r)
        acc[r][n] = _mm512_dpbf16_ps(acc[r][n], kv,
                                     (__m512bh)_mm512_loadu_si512(q + r * D + 32 * j));
    }
  put4<R, false>(acc, _mm_setzero_ps(), out, S);
}

// Any head size, a slot at a time: the pairs of the last D % 32 elements one by one.
void scores_bf16_any(const bf16* q, Stretch k, float* out, int64_t M, int64_t S, int64_t D,
                     int64_t s0, int64_t s1) {
  const int64_t D32 = D / 32 * 32, A = ahead_rows(D, sizeof(bf16));
  for (int64_t s = s0; s < s1; ++s) {
    const bf16* ks = static_cast<const bf16*>(k.p) + s * k.ss;
    prefetch_row(ks + A * k.ss, D * sizeof(bf16), false);
    for (int64_t m = 0; m < M; ++m) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t d = 0; d < D32; d += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(ks + d),
                               (__m512bh)_mm512_loadu_si512(q + m * D + d));
      float r = _mm512_reduce_add_ps(acc);
      for (int64_t d = D32; d < D; ++d)
        r += static_cast<float>(q[m * D + d]) * static_cast<float>(ks[d]);
      out[m * S + s] = r;
    }
  }
}

// bfloat16 keys, D a multiple of 32: four slots at a time as for INT8 codes, the last ones
// by scores_bf16_any.
template <int V>
void scores_bf16(const bf16* q, Stretch k, float* out, int64_t M, int64_t S, int64_t s0,
                 int64_t s1) {
  constexpr int D = 32 * V;
  const int64_t A = ahead_rows(D, sizeof(bf16));
  const bf16* rows = static_cast<const bf16*>(k.p);
  int64_t s = s0;
  for (; s + 4 <= s1; s += 4) {
    const bf16* kr[4];
    for (int n = 0; n < 4; ++n) {
      kr[n] = rows + (s + n) * k.ss;
      prefetch_row(kr[n] + A * k.ss, D * sizeof(bf16), false);
    }
    for (int64_t m = 0; m < M; m += 4) {
      const bf16* qm = q + m * D;
      float* o = out + m * S + s;
      switch (std::min<int64_t>(4, M - m)) {
        case 4: pairs4<4, V>(qm, kr, o, S); break;
        case 3: pairs4<3, V>(qm, kr, o, S); break;
        case 2: pairs4<2, V>(qm, kr, o, S); break;
        default: pairs4<1, V>(qm, kr, o, S);
      }
    }
  }
  scores_bf16_any(q, k, out, M, S, D, s, s1);
}

void scores(const bf16* q, Stretch k, float* out, int64_t M, int64_t S, int64_t D, int64_t s0,
            int64_t s1) {
  if (D == 64) scores_bf16<2>(q, k, out, M, S, s0, s1);
  else if (D == 128) scores_bf16<4>(q, k, out, M, S, s0, s1);
  else scores_bf16_any(q, k, out, M, S, D, s0, s1);
}
#pragma GCC pop_options
}  // namespace avx512
#pragma GCC pop_options

// The ops' choice of loop: 0 portable, 1 AVX2, 2 AVX-512 (mix; scores over INT8 codes).
template <class K>
void scores_with(int64_t kernel, const float* q, K k, float* out, int64_t M, int64_t S,
                 int64_t D, int64_t s0, int64_t s1) {
  if (kernel == 0) scores_portable(q, k, out, M, S, D, s0, s1);
  else avx2::scores(q, k, out, M, S, D, s0, s1);
}
template <class K>
void mix_with(int64_t kernel, const float* p, K v, float* acc, int64_t M, int64_t S, int64_t D,
              int64_t s0, int64_t s1) {
  if (kernel == 0) mix_portable(p, v, acc, M, S, D, s0, s1);
  else if (kernel == 1) avx2::mix(p, v, acc, M, S, D, s0, s1);
  else avx512::mix(p, v, acc, M, S, D, s0, s1);
}

void weigh_with(int64_t kernel, float* s, const uint8_t* mask, int64_t mt, int64_t T, int64_t M,
                int64_t n, float scale, float* mx, float* l) {
  if (kernel == 0) weigh_portable(s, mask, mt, T, M, n, scale, mx, l);
  else if (kernel == 1) avx2::weigh(s, mask, mt, T, M, n, scale, mx, l);
  else avx512::weigh(s, mask, mt, T, M, n, scale, mx, l);
}

// Which kernel a tensor's dtype takes: AVX-512 BF16 only for bfloat16 (scores); else AVX2's.
inline int64_t for_dtype(int64_t isa, at::ScalarType t) {
  return isa == 2 && t != at::kBFloat16 ? 1 : isa;
}

void check_stretch(const char* op, const at::Tensor& a, const at::Tensor& kv, int64_t isa) {
  TORCH_CHECK(a.dim() == 4 && kv.dim() == 4 && a.size(0) == kv.size(0) &&
              a.size(1) == kv.size(1), "regionkv::", op, ": expected [B, H, M, *] against "
              "[B, H, S, D], got ", a.sizes(), " and ", kv.sizes());
  TORCH_CHECK(kv.stride(3) == 1, "regionkv::", op, ": the cached rows must be contiguous");
  TORCH_CHECK(kv.scalar_type() == at::kFloat || kv.scalar_type() == at::kBFloat16,
              "regionkv::", op, ": the cache must be float32 or bfloat16");
  TORCH_CHECK(cpu_has(isa), "regionkv::", op, ": kernel ", isa, " does not run here");
}

// The blocks of n slots that a stretch of S slots is cut into (one for an empty one).
inline int64_t blocks_of(int64_t S, int64_t n = kSlots) {
  return std::max<int64_t>(1, (S + n - 1) / n);
}

// attend's blocks: the fewest of equal length, at most kAttendSlots slots, whose (b, h, block)
// pieces split evenly over the threads. A block has costs of its own (weigh's pass over its
// scores, its partial sums, their combination on one thread): with 128-slot blocks a 4k
// stretch's call took 12-16% longer.
constexpr int64_t kAttendSlots = 512;
inline int64_t attend_slots(int64_t S, int64_t BH) {
  const int64_t T = at::get_num_threads(), fewest = blocks_of(S, kAttendSlots);
  int64_t blocks = fewest;
  while ((BH * blocks) % T && blocks < 4 * fewest) ++blocks;
  return std::max<int64_t>(1, (S + blocks - 1) / blocks);
}

// (b, h, block) pieces: piece i covers (b, h) = i / blocks, slots of block i % blocks.
template <class F>
void pieces(int64_t BH, int64_t S, F&& f, int64_t n = kSlots) {
  const int64_t blocks = blocks_of(S, n);
  at::parallel_for(0, BH * blocks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s0 = i % blocks * n;
      f(i / blocks, i % blocks, s0, std::min(S, s0 + n));
    }
  });
}

// Each reader's scores loop: AVX-512 BF16 multiplies bfloat16 keys by the bfloat16 query (qh),
// and AVX-512 has its own INT8 loop; the rest take the float32 query (qf; an INT8 stretch's in
// byte order) and AVX2's or the portable loop (float32 keys: AVX2's where AVX-512 is).
void scores_of(int64_t isa, const float* qf, const bf16*, Rows<float> k, float* out, int64_t M,
               int64_t S, int64_t D, int64_t s0, int64_t s1) {
  scores_with(for_dtype(isa, at::kFloat), qf, k, out, M, S, D, s0, s1);
}
void scores_of(int64_t isa, const float* qf, const bf16* qh, Rows<bf16> k, float* out,
               int64_t M, int64_t S, int64_t D, int64_t s0, int64_t s1) {
  if (isa == 2) avx512::scores(qh, k.k, out, M, S, D, s0, s1);
  else scores_with(isa, qf, k, out, M, S, D, s0, s1);
}
void scores_of(int64_t isa, const float* qf, const bf16*, Codes k, float* out, int64_t M,
               int64_t S, int64_t D, int64_t s0, int64_t s1) {
  if (isa == 2) avx512::scores(qf, k, out, M, S, D, s0, s1);
  else scores_with(isa, qf, k, out, M, S, D, s0, s1);
}

at::Tensor scores(const at::Tensor& q, const at::Tensor& k, int64_t isa) {
  check_stretch("scores", q, k, isa);
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.size(3) == k.size(3),
              "regionkv::scores: q and k must share dtype and head size");
  const int64_t BH = q.size(0) * q.size(1), M = q.size(2), S = k.size(2), D = k.size(3);
  const int64_t kernel = for_dtype(isa, k.scalar_type());
  // The query in float32 for the portable and AVX2 loops; AVX-512 BF16 multiplies bfloat16.
  at::Tensor qc = kernel == 2 ? q.contiguous() : q.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({q.size(0), q.size(1), M, S}, q.options().dtype(at::kFloat));
  const int64_t elem = k.element_size();
  float* o = out.data_ptr<float>();
  const float* qf = kernel == 2 ? nullptr : qc.data_ptr<float>();
  const bf16* qh = kernel == 2 ? qc.data_ptr<bf16>() : nullptr;
  const bool once = read_once(isa, M);
  pieces(BH, S, [&](int64_t bh, int64_t, int64_t s0, int64_t s1) {
    Stretch ks = stretch(k, bh, elem);
    float* ob = o + bh * M * S;
    const float* qfb = qf ? qf + bh * M * D : nullptr;
    const bf16* qhb = qh ? qh + bh * M * D : nullptr;
    if (k.scalar_type() == at::kFloat)
      scores_of(isa, qfb, qhb, Rows<float>{ks, once}, ob, M, S, D, s0, s1);
    else
      scores_of(isa, qfb, qhb, Rows<bf16>{ks, once}, ob, M, S, D, s0, s1);
  });
  return out;
}

at::Tensor mix(const at::Tensor& p, const at::Tensor& v, int64_t isa) {
  check_stretch("mix", p, v, isa);
  TORCH_CHECK(p.scalar_type() == at::kFloat && p.size(3) == v.size(2),
              "regionkv::mix: p must be float32 [B, H, M, S] over v's S slots");
  const int64_t BH = p.size(0) * p.size(1), M = p.size(2), S = v.size(2), D = v.size(3);
  const int64_t kernel = isa;  // AVX-512 for either dtype where the CPU has it
  const int64_t blocks = blocks_of(S);
  at::Tensor pc = p.contiguous();
  // Each piece sums into its own [M, D] rows; the blocks of a (b, h) are added after.
  std::vector<float> part(BH * blocks * M * D);
  const int64_t elem = v.element_size();
  const float* pp = pc.data_ptr<float>();
  float* acc = part.data();
  const bool once = read_once(isa, M);
  pieces(BH, S, [&](int64_t bh, int64_t block, int64_t s0, int64_t s1) {
    Stretch vs = stretch(v, bh, elem);
    const float* pb = pp + bh * M * S;
    float* ab = acc + (bh * blocks + block) * M * D;
    if (v.scalar_type() == at::kFloat)
      mix_with(kernel, pb, Rows<float>{vs, once}, ab, M, S, D, s0, s1);
    else
      mix_with(kernel, pb, Rows<bf16>{vs, once}, ab, M, S, D, s0, s1);
  });
  at::Tensor out = at::empty({p.size(0), p.size(1), M, D}, p.options());
  float* o = out.data_ptr<float>();
  for (int64_t bh = 0; bh < BH; ++bh) {  // a few thousand floats: one thread
    float* ob = o + bh * M * D;
    std::copy(acc + bh * blocks * M * D, acc + (bh * blocks + 1) * M * D, ob);
    for (int64_t b = 1; b < blocks; ++b) {
      const float* pb = acc + (bh * blocks + b) * M * D;
      for (int64_t i = 0; i < M * D; ++i) ob[i] += pb[i];
    }
  }
  return out;
}

void check_codes(const char* op, const at::Tensor& a, const at::Tensor& w,
                 const at::Tensor& scale, int64_t isa) {
  TORCH_CHECK(a.dim() == 4 && w.dim() == 4 && scale.dim() == 4 && a.size(0) == w.size(0) &&
              a.size(1) == w.size(1) && scale.size(2) == w.size(2) && scale.size(3) == 1,
              "regionkv::", op, ": expected [B, H, M, *], words [B, H, S, D/4] and scales "
              "[B, H, S, 1], got ", a.sizes(), ", ", w.sizes(), " and ", scale.sizes());
  // A scale may come as its float32 bits in an int32 view (kernels/__init__.py: the word of
  // its row as stored, which a compiled graph then passes without a dtype view of its own).
  TORCH_CHECK(w.element_size() == 4 && w.stride(3) == 1 &&
              (scale.scalar_type() == at::kFloat || scale.scalar_type() == at::kInt),
              "regionkv::", op, ": the words must be contiguous 32-bit rows, the scales float32 "
              "(or their bits as int32)");
  TORCH_CHECK(cpu_has(isa), "regionkv::", op, ": kernel ", isa, " does not run here");
}

// A query [B, H, M, D] in float32, each row in byte order (an INT8 stretch's, above).
// Read from the query as it comes (float32 or bfloat16): no float32 copy of it on the way, an
// op of its own at every call (a call's fixed cost is a step's cost: 30 calls a step).
std::vector<float> in_byte_order(const at::Tensor& q) {
  const int64_t D = q.size(3), rows = q.numel() / D;
  std::vector<float> qb(rows * D);
  auto permute = [&](const auto* qp) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < D; ++d) qb[r * D + byte_of(d, D)] = widen(qp[r * D + d]);
  };
  if (q.scalar_type() == at::kBFloat16) permute(q.contiguous().data_ptr<bf16>());
  else permute(q.to(at::kFloat).contiguous().data_ptr<float>());
  return qb;
}

at::Tensor scores8(const at::Tensor& q, const at::Tensor& w, const at::Tensor& scale,
                   int64_t isa) {
  check_codes("scores8", q, w, scale, isa);
  const int64_t BH = q.size(0) * q.size(1), M = q.size(2), S = w.size(2), D = q.size(3);
  TORCH_CHECK(w.size(3) * 4 == D, "regionkv::scores8: ", w.size(3), " words for a head of ", D);
  const std::vector<float> qb = in_byte_order(q);
  at::Tensor out = at::empty({q.size(0), q.size(1), M, S}, q.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  pieces(BH, S, [&](int64_t bh, int64_t, int64_t s0, int64_t s1) {
    Stretch ws = stretch(w, bh, 4), ss = stretch(scale, bh, 4);
    const float* qm = qb.data() + bh * M * D;
    float* ob = o + bh * M * S;
    scores_of(isa, qm, nullptr, Codes{ws, ss}, ob, M, S, D, s0, s1);
  });
  return out;
}

at::Tensor mix8(const at::Tensor& p, const at::Tensor& w, const at::Tensor& scale,
                int64_t isa) {
  check_codes("mix8", p, w, scale, isa);
  TORCH_CHECK(p.scalar_type() == at::kFloat && p.size(3) == w.size(2),
              "regionkv::mix8: p must be float32 [B, H, M, S] over the words' S slots");
  const int64_t BH = p.size(0) * p.size(1), M = p.size(2), S = w.size(2), D = 4 * w.size(3);
  const int64_t blocks = blocks_of(S);
  at::Tensor pc = p.contiguous();
  std::vector<float> part(BH * blocks * M * D);
  const float* pp = pc.data_ptr<float>();
  float* acc = part.data();
  pieces(BH, S, [&](int64_t bh, int64_t block, int64_t s0, int64_t s1) {
    Stretch ws = stretch(w, bh, 4), ss = stretch(scale, bh, 4);
    const float* pb = pp + bh * M * S;
    float* ab = acc + (bh * blocks + block) * M * D;
    mix_with(isa, pb, Codes{ws, ss}, ab, M, S, D, s0, s1);
  });
  at::Tensor out = at::empty({p.size(0), p.size(1), M, D}, p.options());
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < BH * M; ++r) {  // the blocks summed, out of byte order
    const int64_t bh = r / M, m = r % M;
    for (int64_t d = 0; d < D; ++d) {
      float t = 0.f;
      for (int64_t b = 0; b < blocks; ++b)
        t += acc[((bh * blocks + b) * M + m) * D + byte_of(d, D)];
      o[r * D + d] = t;
    }
  }
  return out;
}

// ---- attend: softmax(q . k * scale, masked) @ v over a view's stretches, one call ---------
// Each (b, h, block) piece scores its block's slots for the M rows into a buffer of its own,
// weighs them (the block's max, exp, sum: weigh) and mixes the values by the weights; then the
// blocks of each (b, h), of every stretch, combine as in flash-decoding: no [M, S] scores or
// probabilities leave the call, and the mask, the scale and the exp are taken in the pass that
// scored the block. A region cache's view is a short fast stretch in the model dtype and an
// INT8 middle: one call for both costs what the middle's alone does.
constexpr int64_t kMaxRows = 32;  // the rows a piece's score buffer holds (a step has <= 16)

// Where a stretch's pieces go: its slots from column `col` of the mask, its blocks of `slots`
// slots from block `first` of each (b, h)'s blocks (all stretches') in acc, mx and l.
struct Place {
  int64_t col, slots, first;
};

// Every piece's block: its weighted values acc [M, D], and mx, l [M] (weigh's), at piece i =
// bh * blocks + first + block, blocks those of a (b, h) in all. keys(bh) / values(bh): the readers of (b, h)'s stretch.
template <class Keys, class Values>
void attend_blocks(int64_t isa, const float* qf, const bf16* qh, Keys keys, Values values,
                   const at::Tensor& mask, int64_t H, int64_t BH, int64_t M, int64_t S, int64_t D,
                   float scale, Place place, int64_t blocks, float* acc, float* mx, float* l) {
  const int64_t T = mask.size(2), mt = mask.stride(2);
  const int64_t mb = mask.size(0) == 1 ? 0 : mask.stride(0);
  const int64_t mh = mask.size(1) == 1 ? 0 : mask.stride(1);
  const uint8_t* mp = reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>()) + place.col;
  pieces(BH, S, [&](int64_t bh, int64_t block, int64_t s0, int64_t s1) {
    const int64_t i = bh * blocks + place.first + block, n = s1 - s0;
    float sb[kMaxRows * kAttendSlots];
    scores_of(isa, qf ? qf + bh * M * D : nullptr, qh ? qh + bh * M * D : nullptr,
              keys(bh).skip(s0), sb, M, n, D, 0, n);
    weigh_with(isa, sb, mp + bh / H * mb + bh % H * mh + s0, mt, T, M, n, scale, mx + i * M,
               l + i * M);
    mix_with(isa, sb, values(bh).skip(s0), acc + i * M * D, M, n, D, 0, n);
  }, place.slots);
}

// The blocks of each row combined: y = sum_b w_b acc_b / sum_b w_b l_b with w_b = exp(mx_b -
// max_b mx_b); lse = log of the row's sum of exp(scaled score). bytes[b]: block b's values
// were INT8, its sums in byte order.
void combine(const float* acc, const float* mx, const float* l, int64_t rows, int64_t M,
             int64_t blocks, int64_t D, const std::vector<uint8_t>& bytes, float* y,
             float* lse) {
  std::vector<float> sum(D);
  std::vector<int64_t> order(D);  // natural column d of a sum in byte order
  for (int64_t d = 0; d < D; ++d) order[d] = byte_of(d, D);
  for (int64_t r = 0; r < rows; ++r) {  // a few thousand floats a layer: one thread
    const int64_t first = r / M * blocks * M + r % M;  // row r of its (b, h)'s first block
    float top = -INFINITY;
    for (int64_t b = 0; b < blocks; ++b) top = std::max(top, mx[first + b * M]);
    std::fill(sum.begin(), sum.end(), 0.f);
    float total = 0.f;
    for (int64_t b = 0; b < blocks && top > -INFINITY; ++b) {
      const int64_t i = first + b * M;
      if (l[i] == 0.f) continue;
      const float w = std::exp(mx[i] - top);
      const float* a = acc + i * D;
      total += w * l[i];
      if (bytes[b]) for (int64_t d = 0; d < D; ++d) sum[d] += w * a[order[d]];
      else for (int64_t d = 0; d < D; ++d) sum[d] += w * a[d];
    }
    for (int64_t d = 0; d < D; ++d) y[r * D + d] = total > 0.f ? sum[d] / total : 0.f;
    lse[r] = total > 0.f ? top + std::log(total) : -INFINITY;
  }
}

std::tuple<at::Tensor, at::Tensor> attend(const at::Tensor& q, at::TensorList k,
                                          at::TensorList v,
                                          const c10::List<std::optional<at::Tensor>>& k_scale,
                                          const c10::List<std::optional<at::Tensor>>& v_scale,
                                          const at::Tensor& mask, double scale, int64_t isa) {
  const int64_t n = k.size();
  TORCH_CHECK(n > 0 && static_cast<int64_t>(v.size()) == n &&
              static_cast<int64_t>(k_scale.size()) == n &&
              static_cast<int64_t>(v_scale.size()) == n,
              "regionkv::attend: one k, v, k_scale and v_scale a stretch, got ", k.size(), ", ",
              v.size(), ", ", k_scale.size(), " and ", v_scale.size());
  TORCH_CHECK(q.dim() == 4, "regionkv::attend: q must be [B, H, M, D], got ", q.sizes());
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), D = q.size(3), BH = B * H;
  TORCH_CHECK(M <= kMaxRows, "regionkv::attend: at most ", kMaxRows, " rows, got ", M);
  std::vector<std::optional<at::Tensor>> ks(n), vs(n);
  std::vector<Place> place(n);
  std::vector<uint8_t> bytes;  // a (b, h)'s blocks, each 1 where its stretch is INT8
  int64_t S = 0;
  for (int64_t j = 0; j < n; ++j) {
    ks[j] = k_scale.get(j);
    vs[j] = v_scale.get(j);
    const bool int8 = ks[j].has_value();
    TORCH_CHECK(int8 == vs[j].has_value(),
                "regionkv::attend: keys and values must be both INT8 or both float");
    if (int8) {
      check_codes("attend", q, k[j], *ks[j], isa);
      check_codes("attend", q, v[j], *vs[j], isa);
    } else {
      check_stretch("attend", q, k[j], isa);
      check_stretch("attend", q, v[j], isa);
    }
    const int64_t Sj = k[j].size(2), width = int8 ? 4 * k[j].size(3) : k[j].size(3);
    TORCH_CHECK(k[j].scalar_type() == v[j].scalar_type() && width == D &&
                v[j].size(3) == k[j].size(3) && v[j].size(2) == Sj,
                "regionkv::attend: q [B, H, M, D], k and v [B, H, S, D] of one dtype expected, "
                "got ", q.sizes(), ", ", k[j].sizes(), " and ", v[j].sizes());
    const int64_t slots = attend_slots(Sj, BH);
    place[j] = {S, slots, static_cast<int64_t>(bytes.size())};
    S += Sj;
    bytes.insert(bytes.end(), blocks_of(Sj, slots), int8);
  }
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 4 &&
              (mask.size(0) == B || mask.size(0) == 1) &&
              (mask.size(1) == H || mask.size(1) == 1) && mask.size(2) > 0 &&
              M % mask.size(2) == 0 && mask.size(3) == S,
              "regionkv::attend: mask must be bool [B|1, H|1, T, S] over the stretches' S slots "
              "in all, row m of q reading row m % T, got ", mask.sizes());
  const at::Tensor mk = mask.stride(3) == 1 ? mask : mask.contiguous();
  const int64_t blocks = bytes.size();
  std::vector<float> acc(BH * blocks * M * D), mx(BH * blocks * M), l(BH * blocks * M);
  const float sc = static_cast<float>(scale);
  // The query as each kind of stretch reads it, made once: float32, bfloat16 (AVX-512 BF16's
  // keys), float32 in byte order (INT8 codes).
  at::Tensor qf, qh;
  std::vector<float> qb;
  for (int64_t j = 0; j < n; ++j) {
    const at::Tensor &kj = k[j], &vj = v[j];
    const int64_t Sj = kj.size(2);
    auto run = [&](const float* f, const bf16* h, auto keys, auto values) {
      attend_blocks(isa, f, h, keys, values, mk, H, BH, M, Sj, D, sc, place[j], blocks,
                    acc.data(), mx.data(), l.data());
    };
    if (ks[j].has_value()) {
      if (qb.empty()) qb = in_byte_order(q);
      const at::Tensor &ksj = *ks[j], &vsj = *vs[j];
      run(qb.data(), nullptr,
          [&](int64_t bh) { return Codes{stretch(kj, bh, 4), stretch(ksj, bh, 4)}; },
          [&](int64_t bh) { return Codes{stretch(vj, bh, 4), stretch(vsj, bh, 4)}; });
      continue;
    }
    const int64_t elem = kj.element_size();
    const bool once = read_once(isa, M);
    // AVX-512 BF16 scores bfloat16 keys from the bfloat16 query alone: no float32 copy then.
    const bool wide = kj.scalar_type() == at::kFloat || isa != 2;
    if (wide && !qf.defined()) qf = q.to(at::kFloat).contiguous();
    if (kj.scalar_type() == at::kFloat) {
      run(qf.data_ptr<float>(), nullptr,
          [&](int64_t bh) { return Rows<float>{stretch(kj, bh, elem), once}; },
          [&](int64_t bh) { return Rows<float>{stretch(vj, bh, elem), once}; });
    } else {
      if (isa == 2 && !qh.defined()) qh = q.to(at::kBFloat16).contiguous();
      run(wide ? qf.data_ptr<float>() : nullptr, isa == 2 ? qh.data_ptr<bf16>() : nullptr,
          [&](int64_t bh) { return Rows<bf16>{stretch(kj, bh, elem), once}; },
          [&](int64_t bh) { return Rows<bf16>{stretch(vj, bh, elem), once}; });
    }
  }
  at::Tensor y = at::empty({B, H, M, D}, q.options().dtype(at::kFloat));
  at::Tensor lse = at::empty({B, H, M}, q.options().dtype(at::kFloat));
  combine(acc.data(), mx.data(), l.data(), BH * M, M, blocks, D, bytes, y.data_ptr<float>(),
          lse.data_ptr<float>());
  return {y, lse};
}

// ---- widen8: an INT8 stretch as values, for a prompt chunk's fused attention ----------------
// Inductor's loop for it reads float words as int32 through the stack where it vectorizes for
// a bfloat16 output (16 lanes on AVX2), and splits the work by head only.
at::Tensor widen8(const at::Tensor& w, const at::Tensor& scale, at::ScalarType dtype,
                  int64_t isa) {
  check_codes("widen8", w, w, scale, isa);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "regionkv::widen8: values in float32 or bfloat16, not ", dtype);
  const int64_t H = w.size(1), S = w.size(2), D = 4 * w.size(3), BH = w.size(0) * H;
  at::Tensor out = at::empty({w.size(0), H, S, D}, w.options().dtype(dtype));
  at::parallel_for(0, BH * S, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1;) {  // rows of one (b, h) at a time
      const int64_t bh = r / S, s0 = r % S, s1 = std::min(S, s0 + r1 - r);
      const Codes c{stretch(w, bh, 4), stretch(scale, bh, 4)};
      auto into = [&](auto* o) {  // float32 or bfloat16 rows of this (b, h)
        if (isa == 0) widen_rows(c, o + bh * S * D, D, s0, s1);
        else if (isa == 1) avx2::widen(c, o + bh * S * D, D, s0, s1);
        else avx512::widen(c, o + bh * S * D, D, s0, s1);
      };
      if (dtype == at::kFloat) into(out.data_ptr<float>());
      else into(out.data_ptr<bf16>());
      r += s1 - s0;
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(regionkv, CPU, m) {
  m.impl("scores8", scores8);
  m.impl("mix8", mix8);
  m.impl("gemv", gemv);
  m.impl("scores", scores);
  m.impl("mix", mix);
  m.impl("attend", attend);
  m.impl("widen8", widen8);
}
