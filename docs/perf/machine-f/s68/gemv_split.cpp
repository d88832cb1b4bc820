// Probe (PERFORMANCE 6zr): how a step's GEMVs are split between two threads whose cores read at
// different speeds (machine F: one vCPU streams ~25% slower than the other). The loops and
// shapes of gemv_ceiling.cpp (machine-d/s65), driven from C++ over one arena of 2 MiB pages:
//   g++ -O3 -fopenmp gemv_split.cpp -o gemv_split && ./gemv_split KIND SPLIT   (KIND f32, bf16)
// SPLIT:
//   halves   each weight's 4-row groups in two equal bands (the engine before 6zr)
//   chunksN  N-row chunks handed out in order from a shared counter (dynamic)
//   paced    two bands sized by each thread's measured rows a second (a running share)
// Prints the step's best of 9, and each thread's time in its bands (last pass).
#define main ceiling_main
#include "../../machine-d/s65/gemv_ceiling.cpp"
#undef main
#include <atomic>

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "f32", split = argc > 2 ? argv[2] : "halves";
  struct Shape { int64_t n, k; };
  const Shape layer[5] = {{960, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<Shape> shapes;
  for (int l = 0; l < 30; ++l) for (auto s : layer) shapes.push_back(s);
  shapes.push_back({49152, 576});
  int64_t elems = 0;
  for (auto s : shapes) elems += s.n * s.k;
  const size_t es = kind == "f32" ? 4 : 2, bytes = elems * es;
  const size_t len = (bytes + (2u << 20)) & ~size_t((2u << 20) - 1);
  char* a = static_cast<char*>(mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(a, len, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes; i += 2)
    *reinterpret_cast<u16*>(a + i) = static_cast<u16>(0x3c00 + (i * 2654435761u >> 20) % 255);
  std::vector<float> x(2048, 0.01f), xe(1024, 0.01f), xo(1024, 0.02f), y(49152);
  const int64_t chunk = split.rfind("chunks", 0) == 0 ? std::stoll(split.substr(6)) : 0;
  double share = 0.5, busy[2] = {0, 0}, best = 1e9;  // paced: thread 0's share of the rows
  auto rows = [&](const char* w, int64_t K, int64_t r0, int64_t r1) {
    if (kind == "f32") f32(reinterpret_cast<const float*>(w), x.data(), y.data(), K, r0, r1);
    else bf16(reinterpret_cast<const u16*>(w), xe.data(), xo.data(), y.data(), K, r0, r1);
  };
  for (int it = 0; it < 9; ++it) {
    busy[0] = busy[1] = 0;
    const auto t0 = std::chrono::steady_clock::now();
    size_t off = 0;
    for (auto s : shapes) {
      const int64_t groups = s.n / R;
      std::atomic<int64_t> next{0};
      double took[2];
      const int64_t cut = split == "paced" ? int64_t(groups * share + 0.5) * R : groups / 2 * R;
      #pragma omp parallel num_threads(2)
      {
        const int t = omp_get_thread_num();
        const auto b0 = std::chrono::steady_clock::now();
        if (chunk) {
          for (int64_t c; (c = next.fetch_add(chunk)) < s.n;)
            rows(a + off, s.k, c, std::min(s.n, c + chunk));
        } else {
          rows(a + off, s.k, t ? cut : 0, t ? s.n : cut);
        }
        took[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
      }
      busy[0] += took[0], busy[1] += took[1];
      if (split == "paced") {  // rows a second of each thread -> thread 0's share, smoothed
        const double r0 = cut / took[0], r1 = (s.n - cut) / took[1];
        share = std::min(0.9, std::max(0.1, 0.875 * share + 0.125 * r0 / (r0 + r1)));
      }
      off += s.n * s.k * es;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = dt < best ? dt : best;
  }
  std::printf("%-4s %-9s %4zu MB, 151 calls: %7.3f ms %5.1f GB/s (best of 9); busy %.1f, %.1f ms"
              "; share %.3f\n", kind.c_str(), split.c_str(), bytes / 1000000, best * 1e3,
              bytes / best / 1e9, busy[0] * 1e3, busy[1] * 1e3, share);
}
