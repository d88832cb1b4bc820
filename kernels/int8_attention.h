// The INT8 attention kernels' loops (kernels/decode.cpp), included once per target inside a
// namespace that defines F (the float vector), L (its lanes), load_codes(p) (L int8 codes
// widened to float), lane_sum(v), sum4(a, b, c, d) (four vectors' sums as one __m128), mix8's
// rows and row bytes a pass (kRows64/128, kPass64/128) and kFour (scores8 four slots at a
// time), under that target's `#pragma GCC target`: the loops and the intrinsics they inline
// share one target.

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

// scores8 for R query rows over four slots at a time (kFour: AVX2's 16 registers): each codes
// vector widened once for the R rows, the 4 x R sums in registers, four slots' sums reduced
// (sum4) and scaled to one store.
template <int R>
REGIONKV_INLINE void scores8_four(const float* qb, Stretch w, Stretch sc, float* out,
                                  int64_t S, int64_t D, int64_t s0, int64_t s1) {
  const int64_t A = ahead_rows(D, 1);
  int64_t s = s0;
  for (; s + 4 <= s1; s += 4) {
    const int8_t* r[4];
    for (int j = 0; j < 4; ++j) {
      r[j] = code_row(w, s + j);
      prefetch_row(code_row(w, s + j + A), D);
    }
    F acc[R][4] = {};
    for (int64_t d = 0; d < D; d += L)
      for (int j = 0; j < 4; ++j) {
        const F kv = load_codes(r[j] + d);
        for (int i = 0; i < R; ++i) acc[i][j] += load<F>(qb + i * D + d) * kv;
      }
    const __m128 scale = _mm_setr_ps(scale_of(sc, s), scale_of(sc, s + 1), scale_of(sc, s + 2),
                                     scale_of(sc, s + 3));
    for (int i = 0; i < R; ++i)
      _mm_storeu_ps(out + i * S + s,
                    _mm_mul_ps(sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), scale));
  }
  for (; s < s1; ++s) {  // the last slots of the range, one at a time
    const int8_t* r = code_row(w, s);
    for (int i = 0; i < R; ++i) {
      F acc = {};
      for (int64_t d = 0; d < D; d += L) acc += load<F>(qb + i * D + d) * load_codes(r + d);
      out[i * S + s] = lane_sum(acc) * scale_of(sc, s);
    }
  }
}

inline void scores8(const float* qb, Stretch w, Stretch sc, float* out, int64_t M, int64_t S,
                    int64_t D, int64_t s0, int64_t s1) {
  if (kFour && D % L == 0) {
    for (int64_t m = 0; m < M; m += 3) {  // three rows a pass, then the rest
      const float* q = qb + m * D;
      float* o = out + m * S;
      if (M - m >= 3) scores8_four<3>(q, w, sc, o, S, D, s0, s1);
      else if (M - m == 2) scores8_four<2>(q, w, sc, o, S, D, s0, s1);
      else scores8_four<1>(q, w, sc, o, S, D, s0, s1);
    }
  } else if (D == 64) scores8_rows<64 / L>(qb, w, sc, out, M, S, s0, s1);
  else if (D == 128) scores8_rows<128 / L>(qb, w, sc, out, M, S, s0, s1);
  else scores8_portable(qb, w, sc, out, M, S, D, s0, s1);
}

inline void mix8(const float* p, Stretch w, Stretch sc, float* acc, int64_t M, int64_t S,
                 int64_t D, int64_t s0, int64_t s1) {
  if (D == 64) mix8_fixed<64 / L, kRows64, kPass64>(p, w, sc, acc, M, S, s0, s1);
  else if (D == 128) mix8_fixed<128 / L, kRows128, kPass128>(p, w, sc, acc, M, S, s0, s1);
  else mix8_portable(p, w, sc, acc, M, S, D, s0, s1);
}
