// Probe: a decode step's 151 GEMVs over the default model's shapes (30 layers
// of wqkv 960x576, wo 576x576, w1 and w3 1536x576, w2 576x1536, then the tied head 49152x576)
// from one arena in 2 MiB pages, driven from C++ (no Python, no dispatcher) on two OpenMP
// threads, each weight's 4-row groups split in halves as the engine's GEMV splits them.
//   g++ -O3 -fopenmp [-DROWS=1] gemv_ceiling.cpp -o gemv_ceiling && ./gemv_ceiling KIND [PART]
// PART: step (default), head or layers. KIND:
//   bf16x4  the AVX2 bfloat16 loop with four rows: four rows in flight, x read once for them
//   bf16    the AVX2 bfloat16 loop now: a row at a time, one sequential stream a thread
//   loads   bf16x4's reads and prefetches (ROWS rows in flight, 4 unless -DROWS=N), one xor a
//           load and no arithmetic: what memory gives that pattern
//   f32x4, f32  the float32 loops with four rows and with one, over float32 weights (twice the bytes)
//   stream  a plain read of the whole arena, 8 lanes a load, each thread half of it
//   b512x4  the AVX-512 BF16 loop (machines B, C, E): four rows, x read once for them
//   b512    the same a row at a time, one sequential stream a thread
//   Both prefetch with HINT (-DHINT=_MM_HINT_NTA; T0 unless given); the AVX2 kinds with
//   HINT2 (NTA unless given, as the engine's AVX2 loops).
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using u16 = uint16_t;
#ifndef ROWS
#define ROWS 4
#endif
constexpr int R = 4;          // kRows (bf16x4, f32x4)
constexpr int kAhead = 8192;  // kAheadBytes
#ifndef HINT
#define HINT _MM_HINT_T0
#endif
#ifndef HINT2
#define HINT2 _MM_HINT_NTA
#endif

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
__attribute__((target("avx2,fma"))) inline void ahead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kAhead, HINT2);
}

__attribute__((target("avx2,fma")))
void bf16x4(const u16* w, const float* xe, const float* xo, float* y, int64_t K, int64_t r0,
          int64_t r1) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t n = r0; n + R <= r1; n += R) {
    __m256 acc[R], odd[R];
    for (int r = 0; r < R; ++r) acc[r] = odd[r] = _mm256_setzero_ps();
    const u16* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 16) {
      const __m256 ev = _mm256_loadu_ps(xe + k / 2), od = _mm256_loadu_ps(xo + k / 2);
      for (int r = 0; r < R; ++r) {
        if (k % 32 == 0) ahead(wn + r * K + k);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wn + r * K + k));
        acc[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), ev, acc[r]);
        odd[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, high)), od, odd[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[n + r] = hsum(_mm256_add_ps(acc[r], odd[r]));
  }
}

__attribute__((target("avx2,fma")))
void loads(const u16* w, const float*, const float*, float* y, int64_t K, int64_t r0,
           int64_t r1) {
  for (int64_t n = r0; n + ROWS <= r1; n += ROWS) {
    __m256i acc[ROWS];
    for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_si256();
    const u16* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 16)
      for (int r = 0; r < ROWS; ++r) {
        if (k % 32 == 0) ahead(wn + r * K + k);
        acc[r] = _mm256_xor_si256(
            acc[r], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wn + r * K + k)));
      }
    for (int r = 0; r < ROWS; ++r)
      y[n + r] = static_cast<float>(_mm256_extract_epi32(acc[r], 0));
  }
}

__attribute__((target("avx2,fma")))
void f32x4(const float* w, const float* x, float* y, int64_t K, int64_t r0, int64_t r1) {
  for (int64_t n = r0; n + R <= r1; n += R) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const float* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 8) {
      const __m256 xv = _mm256_loadu_ps(x + k);
      for (int r = 0; r < R; ++r) {
        if (k % 16 == 0) ahead(wn + r * K + k);
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(wn + r * K + k), xv, acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[n + r] = hsum(acc[r]);
  }
}

__attribute__((target("avx2,fma")))
void bf16(const u16* w, const float* xe, const float* xo, float* y, int64_t K, int64_t r0,
          int64_t r1) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t n = r0; n < r1; ++n) {
    __m256 a[4] = {};
    const u16* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 32) {
      ahead(wn + k);
      for (int c = 0; c < 2; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wn + k + 16 * c));
        const __m256 e = _mm256_loadu_ps(xe + k / 2 + 8 * c);
        const __m256 o = _mm256_loadu_ps(xo + k / 2 + 8 * c);
        a[2 * c] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), e, a[2 * c]);
        a[2 * c + 1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, high)), o,
                                       a[2 * c + 1]);
      }
    }
    y[n] = hsum(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
  }
}

__attribute__((target("avx2,fma")))
void f32(const float* w, const float* x, float* y, int64_t K, int64_t r0, int64_t r1) {
  for (int64_t n = r0; n < r1; ++n) {
    __m256 a[2] = {};
    const float* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 16) {
      ahead(wn + k);
      for (int c = 0; c < 2; ++c)
        a[c] = _mm256_fmadd_ps(_mm256_loadu_ps(wn + k + 8 * c), _mm256_loadu_ps(x + k + 8 * c),
                               a[c]);
    }
    y[n] = hsum(_mm256_add_ps(a[0], a[1]));
  }
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
void b512x4(const u16* w, const u16* x, float* y, int64_t K, int64_t r0, int64_t r1) {
  for (int64_t n = r0; n + R <= r1; n += R) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const u16* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 32) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k);
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(wn + r * K + k) + kAhead, HINT);
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(wn + r * K + k), xv);
      }
    }
    for (int r = 0; r < R; ++r) y[n + r] = _mm512_reduce_add_ps(acc[r]);
  }
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
void b512(const u16* w, const u16* x, float* y, int64_t K, int64_t r0, int64_t r1) {
  for (int64_t n = r0; n < r1; ++n) {
    __m512 a[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    const u16* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 32) {  // K is a multiple of 64 in every shape here
      _mm_prefetch(reinterpret_cast<const char*>(wn + k) + kAhead, HINT);
      a[(k / 32) % 2] = _mm512_dpbf16_ps(a[(k / 32) % 2], (__m512bh)_mm512_loadu_si512(wn + k),
                                         (__m512bh)_mm512_loadu_si512(x + k));
    }
    y[n] = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
  }
}

__attribute__((target("avx2,fma"))) float stream(const char* p, size_t bytes) {
  __m256 s[4] = {};
  for (size_t i = 0; i + 128 <= bytes; i += 128)
    for (int j = 0; j < 4; ++j)
      s[j] = _mm256_add_ps(s[j], _mm256_loadu_ps(reinterpret_cast<const float*>(p + i) + 8 * j));
  return hsum(_mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
}

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "bf16", part = argc > 2 ? argv[2] : "step";
  struct Shape { int64_t n, k; };
  const Shape layer[5] = {{960, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<Shape> shapes;
  if (part != "head") for (int l = 0; l < 30; ++l) for (auto s : layer) shapes.push_back(s);
  if (part != "layers") shapes.push_back({49152, 576});
  int64_t elems = 0;
  for (auto s : shapes) elems += s.n * s.k;
  const size_t es = kind.rfind("f32", 0) == 0 ? 4 : 2, bytes = elems * es;
  const size_t len = (bytes + (2u << 20)) & ~size_t((2u << 20) - 1);
  char* a = static_cast<char*>(mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(a, len, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes; i += 2)  // small normal bfloat16 values (and float32 halves)
    *reinterpret_cast<u16*>(a + i) = static_cast<u16>(0x3c00 + (i * 2654435761u >> 20) % 255);
  std::vector<float> x(2048, 0.01f), xe(1024, 0.01f), xo(1024, 0.02f), y(49152);
  std::vector<u16> xh(2048, 0x3c23);  // x as bfloat16 (b512x4, b512)
  double best = 1e9;
  for (int it = 0; it < 9; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    if (kind == "stream") {
      float sink = 0;
      #pragma omp parallel num_threads(2) reduction(+ : sink)
      {
        const size_t half = bytes / 2 / 128 * 128, t = omp_get_thread_num();
        sink += stream(a + t * half, t ? bytes - half : half);
      }
      y[0] = sink;
    } else {
      size_t off = 0;
      for (auto s : shapes) {
        const int64_t groups = s.n / R;
        #pragma omp parallel num_threads(2)
        {
          const int t = omp_get_thread_num();
          const int64_t r0 = groups * t / 2 * R, r1 = groups * (t + 1) / 2 * R;
          const float* wf = reinterpret_cast<const float*>(a + off);
          const u16* wh = reinterpret_cast<const u16*>(a + off);
          if (kind == "f32") f32(wf, x.data(), y.data(), s.k, r0, r1);
          else if (kind == "f32x4") f32x4(wf, x.data(), y.data(), s.k, r0, r1);
          else if (kind == "b512x4") b512x4(wh, xh.data(), y.data(), s.k, r0, r1);
          else if (kind == "b512") b512(wh, xh.data(), y.data(), s.k, r0, r1);
          else (kind == "loads" ? loads : kind == "bf16" ? bf16 : bf16x4)(
              wh, xe.data(), xo.data(), y.data(), s.k, r0, r1);
        }
        off += s.n * s.k * es;
      }
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = dt < best ? dt : best;
  }
  std::printf("%-6s (ROWS %d, HINT %d %d) %-6s %4zu MB, %zu calls: %7.3f ms %5.1f GB/s "
              "(best of 9)\n",
              kind.c_str(), ROWS, static_cast<int>(HINT), static_cast<int>(HINT2),
              part.c_str(), bytes / 1000000,
              kind == "stream" ? size_t(1) : shapes.size(), best * 1e3, bytes / best / 1e9);
}
