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
    prefetch_row(v.row(s + A), L * P * K::kElem);
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
