// The INT8 attention kernels' loops (kernels/decode.cpp), included once per target inside a
// namespace that defines F (the float vector), L (its lanes), load_codes(p) (L int8 codes
// widened to float) and lane_sum(v), under that target's `#pragma GCC target`: the loops and
// the intrinsics they inline share one target.

// scores8 over slots [s0, s1): out[m, s] = scale[s] * qb[m] . codes[s], qb float32 [M, D] in
// byte order, D = L * V in registers.
template <int V>
REGIONKV_INLINE void scores8_rows(const float* qb, Stretch w, Stretch sc, float* out, int64_t M,
                                  int64_t S, int64_t s0, int64_t s1) {
  constexpr int D = L * V;
  const int64_t A = ahead_rows(D, 1);
  for (int64_t s = s0; s < s1; ++s) {
    const int8_t* r = code_row(w, s);
    prefetch_row(code_row(w, s + A), D);
    const float scale = scale_of(sc, s);
    F kv[V];
    for (int j = 0; j < V; ++j) kv[j] = load_codes(r + L * j);
    for (int64_t m = 0; m < M; ++m) {
      F acc = load<F>(qb + m * D) * kv[0];
      for (int j = 1; j < V; ++j) acc += load<F>(qb + m * D + L * j) * kv[j];
      out[m * S + s] = lane_sum(acc) * scale;
    }
  }
}

// mix8 over slots [s0, s1): acc[m, b] = sum of p[m, s] scale[s] codes[s, b], in byte order.
template <int R, int V>
REGIONKV_INLINE void mix8_rows(const float* p, Stretch w, Stretch sc, float* acc, int64_t S,
                               int64_t s0, int64_t s1) {
  constexpr int D = L * V;
  const int64_t A = ahead_rows(D, 1);
  F a[R][V] = {};
  for (int64_t s = s0; s < s1; ++s) {
    const int8_t* r = code_row(w, s);
    prefetch_row(code_row(w, s + A), D);
    const float scale = scale_of(sc, s);
    F kv[V];
    for (int j = 0; j < V; ++j) kv[j] = load_codes(r + L * j);
    for (int i = 0; i < R; ++i) {
      const float c = p[i * S + s] * scale;
      for (int j = 0; j < V; ++j) a[i][j] += c * kv[j];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < V; ++j) __builtin_memcpy(acc + i * D + L * j, &a[i][j], sizeof(F));
}

template <int V, int R>
REGIONKV_INLINE void mix8_fixed(const float* p, Stretch w, Stretch sc, float* acc, int64_t M,
                                int64_t S, int64_t s0, int64_t s1) {
  constexpr int D = L * V;
  for (int64_t m = 0; m < M;) {  // as mix_fixed
    const int64_t r = std::min<int64_t>(R, M - m);
    const float* pm = p + m * S;
    float* am = acc + m * D;
    if (r >= 4 && R >= 4) mix8_rows<(R >= 4 ? 4 : 1), V>(pm, w, sc, am, S, s0, s1);
    else if (r == 3 && R >= 3) mix8_rows<(R >= 3 ? 3 : 1), V>(pm, w, sc, am, S, s0, s1);
    else if (r == 2 && R >= 2) mix8_rows<(R >= 2 ? 2 : 1), V>(pm, w, sc, am, S, s0, s1);
    else mix8_rows<1, V>(pm, w, sc, am, S, s0, s1);
    m += r >= 4 && R >= 4 ? 4 : r;
  }
}

inline void scores8(const float* qb, Stretch w, Stretch sc, float* out, int64_t M, int64_t S,
                    int64_t D, int64_t s0, int64_t s1) {
  if (D == 64) scores8_rows<64 / L>(qb, w, sc, out, M, S, s0, s1);
  else if (D == 128) scores8_rows<128 / L>(qb, w, sc, out, M, S, s0, s1);
  else scores8_portable(qb, w, sc, out, M, S, D, s0, s1);
}

inline void mix8(const float* p, Stretch w, Stretch sc, float* acc, int64_t M, int64_t S,
                 int64_t D, int64_t s0, int64_t s1) {
  if (D == 64) mix8_fixed<64 / L, kRows64>(p, w, sc, acc, M, S, s0, s1);
  else if (D == 128) mix8_fixed<128 / L, kRows128>(p, w, sc, acc, M, S, s0, s1);
  else mix8_portable(p, w, sc, acc, M, S, D, s0, s1);
}
