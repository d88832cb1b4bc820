// The mix loops both targets share (kernels/decode.cpp), included once per target inside a
// namespace that defines F, L, lanes(const bf16*), lanes(const int8_t*), kRows64/128 and
// kPass64/128, under that target's `#pragma GCC target`. A reader K (Rows<T>, Codes) says how a
// stretch is stored.

REGIONKV_INLINE F lanes(const float* p) {
  F v; __builtin_memcpy(&v, p, sizeof v); return v;
}

// mix for a head size of D = L * V, P vectors of the row a pass (the reader v starts at the
// pass's first column): R rows' sums held in registers across the slots, each value vector
// widened once for them, each slot's scale taken into its weights.
template <int R, int P, class K>
REGIONKV_INLINE void mix_rows(const float* p, K v, float* acc, int64_t D, int64_t S, int64_t s0,
                              int64_t s1) {
  const int64_t A = ahead_rows(D, K::kElem);
  F a[R][P] = {};
  for (int64_t s = s0; s < s1; ++s) {
    const auto r = v.row(s);
    prefetch_row(v.row(s + A), L * P * K::kElem, v.once);
    const float scale = v.scale(s);  // Rows': 1, folded away
    float w[R];
    for (int i = 0; i < R; ++i) w[i] = p[i * S + s] * scale;
    for (int j = 0; j < P; ++j) {
      const F x = lanes(r + L * j);
      for (int i = 0; i < R; ++i) a[i][j] += w[i] * x;
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < P; ++j) __builtin_memcpy(acc + i * D + L * j, &a[i][j], sizeof(F));
}

template <int V, int R, int P, class K>
REGIONKV_INLINE void mix_fixed(const float* p, K v, float* acc, int64_t M, int64_t S,
                               int64_t s0, int64_t s1) {
  constexpr int D = L * V;
  for (int c = 0; c < D; c += L * P) {  // the row's columns in passes of P vectors
    const K vc = v.from(c);
    for (int64_t m = 0; m < M;) {  // R rows a pass, then the rest in one pass of fewer
      const int64_t r = std::min<int64_t>(R, M - m);
      const float* pm = p + m * S;
      float* am = acc + m * D + c;
      if (r >= 4 && R >= 4) mix_rows<(R >= 4 ? 4 : 1), P>(pm, vc, am, D, S, s0, s1);
      else if (r == 3 && R >= 3) mix_rows<(R >= 3 ? 3 : 1), P>(pm, vc, am, D, S, s0, s1);
      else if (r == 2 && R >= 2) mix_rows<(R >= 2 ? 2 : 1), P>(pm, vc, am, D, S, s0, s1);
      else mix_rows<1, P>(pm, vc, am, D, S, s0, s1);
      m += r >= 4 && R >= 4 ? 4 : r;
    }
  }
}

// mix over any reader: head sizes 64 and 128 in registers, up to three quarters of them
// accumulators (AVX2: 16 ymm, three rows of half a 64-wide row, passes of 32 columns; AVX-512:
// 32 zmm, whole rows); others by the portable loop.
template <class K>
void mix(const float* p, K v, float* acc, int64_t M, int64_t S, int64_t D, int64_t s0,
         int64_t s1) {
  if (D == 64) mix_fixed<64 / L, kRows64, kPass64>(p, v, acc, M, S, s0, s1);
  else if (D == 128) mix_fixed<128 / L, kRows128, kPass128>(p, v, acc, M, S, s0, s1);
  else mix_portable(p, v, acc, M, S, D, s0, s1);
}

// e^x for x <= 0, lanes below -87.3 (float32's smallest normal) 0: e^x = 2^n e^r with
// n = round(x log2 e) and r = x - n ln 2 (ln 2 in two parts), e^r by Cephes' polynomial of
// degree 7 (relative error ~2e-7, about what the softmax of Inductor's reductions reads).
REGIONKV_INLINE F exp_neg(F x) {
  typedef int32_t I __attribute__((vector_size(sizeof(F))));
  const F zero = {}, lo = zero - 87.3365448f;
  const F xc = x < lo ? lo : x;
  const F n = (xc * 1.44269504f + 12582912.f) - 12582912.f;  // rounds to the nearest integer
  const F r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  F p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;  // 2^n
  F two_n;
  __builtin_memcpy(&two_n, &bits, sizeof two_n);
  return x < lo ? zero : (p * r * r + r + 1.f) * two_n;
}

// The attend op's weights over a block of n slots for M rows, in place: s [M, n] the scores ->
// e = exp(s * scale - mx) where the row's mask (row m % T of mask, rows mt bytes apart) holds,
// 0 elsewhere; mx[m] the row's largest scaled score (-inf: nothing to attend), l[m] the
// weights' sum.
void weigh(float* s, const uint8_t* mask, int64_t mt, int64_t T, int64_t M, int64_t n,
           float scale, float* mx, float* l) {
  const int64_t nL = n / L * L;
  const F zero = {}, none = zero - __builtin_inff();
  for (int64_t m = 0; m < M; ++m) {
    float* x = s + m * n;
    const int8_t* keep = reinterpret_cast<const int8_t*>(mask + m % T * mt);
    F top = none;
    for (int64_t i = 0; i < nL; i += L) {
      const F v = lanes(keep + i) != zero ? lanes(x + i) * scale : none;
      __builtin_memcpy(x + i, &v, sizeof v);
      top = top > v ? top : v;
    }
    float t = top[0];
    for (int j = 1; j < L; ++j) t = std::max(t, top[j]);
    for (int64_t i = nL; i < n; ++i) {
      x[i] = keep[i] ? x[i] * scale : -__builtin_inff();
      t = std::max(t, x[i]);
    }
    mx[m] = t;
    if (t == -__builtin_inff()) {  // nothing to attend in this block
      std::fill(x, x + n, 0.f);
      l[m] = 0.f;
      continue;
    }
    F sum = zero;
    for (int64_t i = 0; i < nL; i += L) {
      const F e = exp_neg(lanes(x + i) - t);
      __builtin_memcpy(x + i, &e, sizeof e);
      sum += e;
    }
    float total = 0.f;
    for (int j = 0; j < L; ++j) total += sum[j];
    for (int64_t i = nL; i < n; ++i) total += x[i] = std::exp(x[i] - t);
    l[m] = total;
  }
}

// widen_rows (kernels/decode.cpp) compiled for the target.
template <class T>
void widen(Codes w, T* out, int64_t D, int64_t s0, int64_t s1) {
  widen_rows(w, out, D, s0, s1);
}
