// bfs — breadth-first search over a graph larger than the GPU cache that holds it: the graph's
// CSR arrays lie striped over several controllers, kernels read them as `cunvme::array`s
// through a page cache in GPU memory, and the result is checked against the same BFS with the
// graph in GPU memory. Prints both times, the cache's hit rate and the page reads.
//
//   build/examples/bfs                               4 emulated controllers; 512 Ki vertices, 8 Mi edges (36 MiB), 8 MiB cache
//   build/examples/bfs --vertices 65536 --degree 8 --slots 256 emu:blocks=16384 emu:blocks=16384
//
// The graph's generator is `make_graph()`: a synthetic power-law graph (edge sources and
// targets drawn with density ∝ x^-2/3, so low-numbered vertices are hubs), built as CSR on the
// host and written through the volume before the kernels run. Exits 0 when every vertex's
// depth matches, 1 otherwise, 77 (Meson's "skipped") without a CUDA GPU.
#include "volume_support.hpp"

#include <cunvme/cache/array.cuh>
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>

#include <thrust/device_vector.h>
#include <thrust/fill.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using queue = example::volume_queue;
using cache = cunvme::page_cache<queue, cunvme::doorbell::mmio>;
constexpr std::uint32_t unreached = 0xffffffffu;
constexpr std::uint32_t edges_at_once = 32;

struct csr {
  std::vector<std::uint64_t> offsets;  // [vertices + 1]
  std::vector<std::uint32_t> edges;
};

/// A vertex drawn with density ∝ x^-2/3 on [0, n): u³ of a uniform u.
std::uint32_t skewed(std::uint64_t h, std::uint32_t n) {
  const double u = static_cast<double>(h >> 11) / 9007199254740992.0;
  return std::min<std::uint32_t>(n - 1, static_cast<std::uint32_t>(u * u * u * n));
}

/// The graph's generator: `vertices × degree` directed edges, both ends power-law skewed (so
/// vertex 0 is a hub and most vertices are reachable from it), as CSR.
csr make_graph(std::uint32_t vertices, std::uint32_t degree) {
  const std::uint64_t m = std::uint64_t{vertices} * degree;
  std::vector<std::uint32_t> from(m), to(m);
  std::vector<std::uint64_t> count(vertices + 1, 0);
  for (std::uint64_t e = 0; e < m; ++e) {
    // Every vertex gets one edge out so that none is a dead end; the rest go to hubs.
    from[e] = e < vertices ? static_cast<std::uint32_t>(e) : skewed(example::mix(2 * e), vertices);
    to[e] = skewed(example::mix(2 * e + 1), vertices) ^ static_cast<std::uint32_t>(example::mix(e) & 1);
    to[e] = std::min(to[e], vertices - 1);
    ++count[from[e] + 1];
  }
  csr g;
  g.offsets.resize(vertices + 1);
  for (std::uint32_t v = 0; v < vertices; ++v) count[v + 1] += count[v];
  std::copy(count.begin(), count.end(), g.offsets.begin());
  g.edges.resize(m);
  for (std::uint64_t e = 0; e < m; ++e) g.edges[count[from[e]]++] = to[e];
  return g;
}

/// The graph as a kernel reads it: through the cache …
struct cached_graph {
  cunvme::array<std::uint64_t, cache> offsets;
  cunvme::array<std::uint32_t, cache> edges;
  __device__ cunvme::io_result range(std::uint32_t v, std::uint64_t (&r)[2]) const { return offsets.copy(v, 2, r); }
  __device__ cunvme::io_result targets(std::uint64_t first, std::uint32_t n, std::uint32_t* out) const { return edges.copy(first, n, out); }
};
/// … or from GPU memory.
struct memory_graph {
  const std::uint64_t* offsets;
  const std::uint32_t* edges;
  __device__ cunvme::io_result range(std::uint32_t v, std::uint64_t (&r)[2]) const {
    r[0] = offsets[v], r[1] = offsets[v + 1];
    return {};
  }
  __device__ cunvme::io_result targets(std::uint64_t first, std::uint32_t n, std::uint32_t* out) const {
    for (std::uint32_t k = 0; k < n; ++k) out[k] = edges[first + k];
    return {};
  }
};

struct level_state {
  unsigned long long failed;
  cunvme::io_result first;
  std::uint32_t next_size;
};

/// One level: thread k expands frontier vertex k; a neighbour first reached gets depth + 1 and
/// joins the next frontier.
template <class Graph>
__global__ void expand(Graph g, const std::uint32_t* frontier, std::uint32_t size, std::uint32_t* next, std::uint32_t* depth,
                       std::uint32_t level, level_state* s) {
  const std::uint64_t k = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k >= size) return;
  std::uint64_t r[2];
  cunvme::io_result res = g.range(frontier[k], r);
  std::uint32_t buffer[edges_at_once];
  for (std::uint64_t e = r[0]; res.ok() && e < r[1]; e += edges_at_once) {
    const auto n = static_cast<std::uint32_t>(r[1] - e < edges_at_once ? r[1] - e : edges_at_once);
    res = g.targets(e, n, buffer);
    for (std::uint32_t j = 0; res.ok() && j < n; ++j) {
      if (atomicCAS(&depth[buffer[j]], unreached, level + 1) == unreached) next[atomicAdd(&s->next_size, 1u)] = buffer[j];
    }
  }
  if (!res.ok() && atomicAdd(&s->failed, 1ull) == 0) s->first = res;
}

struct result {
  double ms = 0;
  std::uint32_t levels = 0;
  std::uint64_t reached = 0;
  bool ok = true;
  std::string why;
};

/// BFS from vertex 0; `depth` gets each vertex's depth (`unreached` where none).
template <class Graph>
result bfs(const Graph& g, std::uint32_t vertices, thrust::device_vector<std::uint32_t>& depth, level_state* s, cudaStream_t stream) {
  thrust::device_vector<std::uint32_t> a(vertices), b(vertices);
  thrust::fill(depth.begin(), depth.end(), unreached);
  depth[0] = 0;
  a[0] = 0;
  std::uint32_t size = 1;
  result out;
  example::timer clock;
  for (std::uint32_t level = 0; size > 0; ++level) {
    *s = {};
    expand<<<(size + 127) / 128, 128, 0, stream>>>(g, thrust::raw_pointer_cast(a.data()), size, thrust::raw_pointer_cast(b.data()),
                                                   thrust::raw_pointer_cast(depth.data()), level, s);
    example::check(cudaGetLastError(), "launch a level");
    example::check(cudaStreamSynchronize(stream), "run a level");
    if (s->failed != 0) return {0, level, 0, false, std::to_string(s->failed) + " threads failed; first: " + cunvme::to_string(s->first)};
    out.reached += size;
    size = s->next_size;
    a.swap(b);
    out.levels = level + 1;
  }
  out.ms = clock.seconds() * 1e3;
  return out;
}

struct options {
  std::vector<std::string> uris;
  std::uint64_t vertices = 1 << 19, degree = 16, slots = 2048;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto number = [&](std::uint64_t& to) { to = example::positive_number(argc, argv, i); };
    if (a == "--vertices") number(o.vertices);
    else if (a == "--degree") number(o.degree);
    else if (a == "--slots") number(o.slots);
    else if (a.rfind("--", 0) == 0) throw std::invalid_argument("unknown option " + a + " (--vertices N, --degree N, --slots N, then URIs)");
    else o.uris.push_back(a);
  }
  if (o.vertices > 0xffff'fffeull || o.degree > 1024) throw std::invalid_argument("--vertices is at most 2^32 - 2 and --degree at most 1024");
  if (o.uris.empty()) o.uris = {"emu:blocks=65536", "emu:blocks=65536", "emu:blocks=65536", "emu:blocks=65536"};
  return o;
}

int run(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress as it comes, also into a file
  const options o = parse(argc, argv);
  constexpr std::uint64_t stripe = 64 * 1024;
  const example::striped_volumes volumes(o.uris, stripe);
  const cunvme::host::volume& host_volume = *volumes.host;
  const cunvme::host::volume& gpu_volume = *volumes.gpu;

  const auto vertices = static_cast<std::uint32_t>(o.vertices);
  const csr g = make_graph(vertices, static_cast<std::uint32_t>(o.degree));
  const std::uint64_t offsets_bytes = g.offsets.size() * 8, edges_bytes = g.edges.size() * 4;
  const std::uint64_t edges_at = (offsets_bytes + stripe - 1) / stripe * stripe;
  const std::uint64_t volume_bytes = gpu_volume.blocks() * gpu_volume.block_bytes();
  if (edges_at + edges_bytes > volume_bytes) {
    throw std::invalid_argument("the graph needs " + std::to_string((edges_at + edges_bytes) >> 20) + " MiB; the volume has " + std::to_string(volume_bytes >> 20));
  }
  example::write_volume(host_volume, 0, g.offsets.data(), offsets_bytes, "graph's offsets");
  example::write_volume(host_volume, edges_at, g.edges.data(), edges_bytes, "graph's edges");

  // Slots in the controllers' DMA memory, as tier 1 has its data (no peer-to-peer needed); with
  // peer-to-peer DMA (tier 2) pass cunvme::host::allocate_gpu to put them in GPU memory.
  cunvme::host::page_cache_memory memory(gpu_volume, 4096, o.slots, cunvme::host::gpu_bookkeeping(*volumes.ctrls[0], example::where));
  const cache c(memory.device_view(), gpu_volume.device_view());
  const cached_graph on_volume{{c, 0, g.offsets.size()}, {c, edges_at, g.edges.size()}};
  thrust::device_vector<std::uint64_t> d_offsets(g.offsets.begin(), g.offsets.end());
  thrust::device_vector<std::uint32_t> d_edges(g.edges.begin(), g.edges.end());
  const memory_graph in_memory{thrust::raw_pointer_cast(d_offsets.data()), thrust::raw_pointer_cast(d_edges.data())};

  const example::mapped<level_state> s("allocate the level state");
  example::stream stream;
  thrust::device_vector<std::uint32_t> depth_volume(vertices), depth_memory(vertices);
  std::printf("bfs: %u vertices, %zu edges (%llu MiB of CSR) striped over %zu controllers; cache %llu MiB\n", vertices, g.edges.size(),
              static_cast<unsigned long long>((offsets_bytes + edges_bytes) >> 20), o.uris.size(),
              static_cast<unsigned long long>(o.slots * 4096 >> 20));
  const result rm = bfs(in_memory, vertices, depth_memory, s.get(), stream);
  const result rv = bfs(on_volume, vertices, depth_volume, s.get(), stream);
  if (!rv.ok) {
    std::printf("  on the volume: %s: no figures reported\n", rv.why.c_str());
    return 1;
  }
  const bool same = depth_volume == depth_memory;
  if (!same) {
    std::printf("  the depths differ from the in-memory BFS: no figures reported\n");
    return 1;
  }
  const cunvme::page_cache_counters n = memory.counters();
  std::printf("  in GPU memory: %.1f ms; on the volume: %.1f ms (%.1fx); %u levels, %llu vertices reached; every depth verified\n", rm.ms, rv.ms,
              rv.ms / std::max(rm.ms, 1e-3), rv.levels, static_cast<unsigned long long>(rv.reached));
  std::printf("  cache: %.1f %% hits (%llu hits, %llu misses = page reads, %llu evictions)\n",
              100.0 * n.hits / std::max<unsigned long long>(1, n.hits + n.misses), static_cast<unsigned long long>(n.hits),
              static_cast<unsigned long long>(n.misses), static_cast<unsigned long long>(n.evictions));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_main("bfs", [&] { return run(argc, argv); });
}
