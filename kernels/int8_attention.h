// The INT8 mix kernel's loops (kernels/decode.cpp), included once per target inside a namespace
// that defines F (the float vector), L (its lanes), load_codes(p) (L int8 codes widened to
// float), and mix8's rows and row bytes a pass (kRows64/128, kPass64/128), under that target's
// `#pragma GCC target`: the loops and the intrinsics they inline share one target. (scores8:
// AVX2 reads the codes with the float keys' loop, scores_avx2; AVX-512's is in decode.cpp.)

// mix8 over slots [s0, s1): acc[m, b] = sum of p[m, s] scale[s] codes[s, b], in byte order,
// for the P * L bytes of a row from where the stretch w starts (acc's rows D apart).
template <int R, int P>
REGIONKV_INLINE void mix8_rows(const float* p, Stretch w, Stretch sc, float* acc, int64_t D,
                               int64_t S, int64_t s0, int64_t s1) {
  const int64_t A = ahead_rows(D, 1);
  F a[R][P] = {};
  for (int64_t s = s0; s < s1; ++s) {
    const int8_t* r = code_row(w, s);
    prefetch_row(code_row(w, s + A), L * P);
    const float scale = scale_of(sc, s);
    float c[R];
    for (int i = 0; i < R; ++i) c[i] = p[i * S + s] * scale;
    for (int j = 0; j < P; ++j) {
      const F kv = load_codes(r + L * j);
      for (int i = 0; i < R; ++i) a[i][j] += c[i] * kv;
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < P; ++j) __builtin_memcpy(acc + i * D + L * j, &a[i][j], sizeof(F));
}

template <int V, int R, int P>
REGIONKV_INLINE void mix8_fixed(const float* p, Stretch w, Stretch sc, float* acc, int64_t M,
                                int64_t S, int64_t s0, int64_t s1) {
  constexpr int D = L * V;
  for (int c = 0; c < D; c += L * P) {  // as mix_fixed: the row's bytes in passes of P vectors
    const Stretch wc{static_cast<const int8_t*>(w.p) + c, w.ss};
    for (int64_t m = 0; m < M;) {
      const int64_t r = std::min<int64_t>(R, M - m);
      const float* pm = p + m * S;
      float* am = acc + m * D + c;
      if (r >= 4 && R >= 4) mix8_rows<(R >= 4 ? 4 : 1), P>(pm, wc, sc, am, D, S, s0, s1);
      else if (r == 3 && R >= 3) mix8_rows<(R >= 3 ? 3 : 1), P>(pm, wc, sc, am, D, S, s0, s1);
      else if (r == 2 && R >= 2) mix8_rows<(R >= 2 ? 2 : 1), P>(pm, wc, sc, am, D, S, s0, s1);
      else mix8_rows<1, P>(pm, wc, sc, am, D, S, s0, s1);
      m += r >= 4 && R >= 4 ? 4 : r;
    }
  }
}

inline void mix8(const float* p, Stretch w, Stretch sc, float* acc, int64_t M, int64_t S,
                 int64_t D, int64_t s0, int64_t s1) {
  if (D == 64) mix8_fixed<64 / L, kRows64, kPass64>(p, w, sc, acc, M, S, s0, s1);
  else if (D == 128) mix8_fixed<128 / L, kRows128, kPass128>(p, w, sc, acc, M, S, s0, s1);
  else mix8_portable(p, w, sc, acc, M, S, D, s0, s1);
}
