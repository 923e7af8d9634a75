// gnn_features — a GNN mini-batch's feature gather (GraphSAGE style): for each seed node of a
// batch, sample `fanout` neighbours from the graph and average their feature rows with the
// seed's own. The graph (CSR offsets and edges) and the feature table lie striped over several
// controllers; kernels see them as `cunvme::array`s through one page cache in GPU memory. A warp
// serves one seed: its lanes read the seed's CSR range and sample one neighbour each, then the
// warp reads each chosen node's 256-byte feature row 8 bytes a lane (coalesced, so a warp's
// lanes hit one page together). Every batch is checked against the same computation on copies
// in GPU memory, and both are timed.
//
//   build/examples/gnn_features                       4 emulated controllers, 128 Ki nodes, 16 MiB of cache
//   build/examples/gnn_features --nodes 1048576 --slots 16384 emu:blocks=1048576 emu:blocks=1048576
//
// The data come from generators (`feature`, `degree_of`, `edge_of`), written through the volume
// from the host before the kernels run (on a real SSD this overwrites the start of each
// namespace). Exits 0 when every output row matches, 1 otherwise, 77 (Meson's "skipped")
// without a CUDA GPU.
#include "volume_support.hpp"

#include <cunvme/cache/array.cuh>
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>

#include <thrust/device_vector.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::uint64_t row_bytes = 256;  // 64 floats a node: a float2 per lane of a warp
constexpr std::uint64_t page = 4096;

__host__ __device__ float feature(std::uint64_t node, std::uint32_t column) {
  return static_cast<float>(example::mix(node * 64 + column) >> 40) / 16777216.0f;
}
/// Node v's out-degree: 0 to 2 × `mean` − 1 (some nodes have none).
std::uint64_t degree_of(std::uint64_t v, std::uint64_t mean) { return example::mix(v ^ 0x5eedull) % (2 * mean); }
std::uint64_t edge_of(std::uint64_t v, std::uint64_t j, std::uint64_t nodes) { return example::mix(v * 1000003ull + j) % nodes; }

using queue = example::volume_queue;
using cache = cunvme::page_cache<queue, cunvme::doorbell::mmio>;

/// The graph and features through the cache.
struct cached_graph {
  cunvme::array<std::uint64_t, cache> offsets, edges;
  cunvme::array<float2, cache> features;  // element 32 × node + lane
  __device__ cunvme::io_result offset(std::uint64_t i, std::uint64_t& out) const { return offsets.get(i, out); }
  __device__ cunvme::io_result edge(std::uint64_t i, std::uint64_t& out) const { return edges.get(i, out); }
  __device__ cunvme::io_result features_of(std::uint64_t node, std::uint32_t lane, float2& out) const { return features.get(node * 32 + lane, out); }
};

/// The same in GPU memory.
struct memory_graph {
  const std::uint64_t* offsets;
  const std::uint64_t* edges;
  const float2* features;
  __device__ cunvme::io_result offset(std::uint64_t i, std::uint64_t& out) const { return out = offsets[i], cunvme::io_result{}; }
  __device__ cunvme::io_result edge(std::uint64_t i, std::uint64_t& out) const { return out = edges[i], cunvme::io_result{}; }
  __device__ cunvme::io_result features_of(std::uint64_t node, std::uint32_t lane, float2& out) const {
    return out = features[node * 32 + lane], cunvme::io_result{};
  }
};

struct outcome {
  unsigned long long failed;
  cunvme::io_result first;
};

/// Warp w aggregates seed `seeds[w]` of batch `batch`: lanes below `fanout` sample a neighbour
/// each (none where the seed has no edges), lane `fanout` stands for the seed itself; then the
/// warp sums those rows lane by lane and writes their mean, 32 float2s, to out[32w …].
/// (Registers not bounded: on the H200 `__launch_bounds__(256, 4)` made it slower, 185 against
/// 209 M rows/s with every page cached, unlike P7a's coalesced gather.)
template <class Graph>
__global__ void aggregate(Graph g, const std::uint64_t* seeds, std::uint64_t n, std::uint32_t fanout, std::uint64_t batch, float2* out, outcome* o) {
  const std::uint64_t w = (std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const std::uint32_t lane = threadIdx.x % 32;
  if (w >= n) return;  // whole warps: the grid is a multiple of 32 threads
  const std::uint64_t seed = seeds[w];
  cunvme::io_result r{};
  std::uint64_t begin = 0, end = 0, node = seed;
  bool take = lane == fanout;
  if (lane < fanout) {
    if (r = g.offset(seed, begin); r.ok()) r = g.offset(seed + 1, end);
    if (r.ok() && end > begin) {
      r = g.edge(begin + example::mix(seed ^ (batch << 40) ^ lane) % (end - begin), node);
      take = r.ok();
    }
  }
  float2 sum{0.0f, 0.0f};
  std::uint32_t count = 0;
  for (std::uint32_t j = 0; j <= fanout; ++j) {
    const std::uint64_t from = __shfl_sync(0xffffffffu, node, j);
    if (__shfl_sync(0xffffffffu, take ? 1 : 0, j) == 0) continue;
    float2 v{};
    if (const cunvme::io_result got = g.features_of(from, lane, v); !got.ok()) {
      if (r.ok()) r = got;
      continue;
    }
    sum.x += v.x, sum.y += v.y;
    ++count;
  }
  out[w * 32 + lane] = float2{sum.x / static_cast<float>(count), sum.y / static_cast<float>(count)};
  if (!r.ok() && atomicAdd(&o->failed, 1ull) == 0) o->first = r;
}

__global__ void count_differences(const float2* a, const float2* b, std::uint64_t n, unsigned long long* differ) {
  const std::uint64_t k = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k < n && (__float_as_uint(a[k].x) != __float_as_uint(b[k].x) || __float_as_uint(a[k].y) != __float_as_uint(b[k].y))) atomicAdd(differ, 1ull);
}

struct options {
  std::vector<std::string> uris;
  std::uint64_t nodes = 1 << 17, degree = 16, fanout = 10, batch = 8192, batches = 8, slots = 4096;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto number = [&](std::uint64_t& to) { to = example::positive_number(argc, argv, i); };
    if (a == "--nodes") number(o.nodes);
    else if (a == "--degree") number(o.degree);
    else if (a == "--fanout") number(o.fanout);
    else if (a == "--batch") number(o.batch);
    else if (a == "--batches") number(o.batches);
    else if (a == "--slots") number(o.slots);
    else if (a.rfind("--", 0) == 0) {
      throw std::invalid_argument("unknown option " + a + " (--nodes N, --degree N, --fanout N, --batch N, --batches N, --slots N, then URIs)");
    } else o.uris.push_back(a);
  }
  if (o.fanout > 31) throw std::invalid_argument("--fanout " + std::to_string(o.fanout) + ": at most 31 (a warp's lanes, one for the seed)");
  if (o.degree > (std::uint64_t{1} << 32) || o.batch > (std::uint64_t{1} << 24) || o.batches > 1024) {
    throw std::invalid_argument("--degree takes at most 2^32, --batch 2^24 (seeds), --batches 1024");
  }
  if (o.uris.empty()) o.uris = {"emu:blocks=65536", "emu:blocks=65536", "emu:blocks=65536", "emu:blocks=65536"};
  return o;
}

std::uint64_t round_up(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

int run(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const options o = parse(argc, argv);
  const example::striped_volumes volumes(o.uris, 64 * 1024);
  // Compared before multiplying: a node count near 2^64 must not wrap into a small table.
  if (o.nodes > volumes.bytes() / row_bytes) {
    throw std::invalid_argument(std::to_string(o.nodes) + " nodes' features do not fit the volume's " + std::to_string(volumes.bytes() >> 20) + " MiB");
  }

  // The most the graph can need (every node of the largest degree), checked before it is built:
  // a degree or node count far past the volume is refused at once, not after hours of generating.
  std::uint64_t max_edges = 0, most = 0;
  if (__builtin_mul_overflow(o.nodes, 2 * o.degree - 1, &max_edges) || __builtin_mul_overflow(max_edges, std::uint64_t{8}, &most) ||
      __builtin_add_overflow(most, round_up(o.nodes * row_bytes, page) + round_up((o.nodes + 1) * 8, page), &most) || most > volumes.bytes()) {
    throw std::invalid_argument(std::to_string(o.nodes) + " nodes of degree up to " + std::to_string(2 * o.degree - 1) +
                                " and their features may not fit the volume's " + std::to_string(volumes.bytes() >> 20) + " MiB");
  }

  // The graph in CSR on the host; the volume holds features, then offsets, then edges, each from a page boundary.
  std::vector<std::uint64_t> offsets(o.nodes + 1, 0), edges;
  for (std::uint64_t v = 0; v < o.nodes; ++v) {
    const std::uint64_t d = degree_of(v, o.degree);
    for (std::uint64_t j = 0; j < d; ++j) edges.push_back(edge_of(v, j, o.nodes));
    offsets[v + 1] = edges.size();
  }
  std::vector<float> rows(o.nodes * 64);
  for (std::uint64_t v = 0; v < o.nodes; ++v)
    for (std::uint32_t c = 0; c < 64; ++c) rows[v * 64 + c] = feature(v, c);
  const std::uint64_t offsets_at = round_up(o.nodes * row_bytes, page);
  const std::uint64_t edges_at = round_up(offsets_at + offsets.size() * 8, page);
  const std::uint64_t total = edges_at + edges.size() * 8;  // within `most`
  example::write_volume(*volumes.host, 0, rows.data(), rows.size() * 4, "features");
  example::write_volume(*volumes.host, offsets_at, offsets.data(), offsets.size() * 8, "CSR offsets");
  if (!edges.empty()) example::write_volume(*volumes.host, edges_at, edges.data(), edges.size() * 8, "CSR edges");
  thrust::device_vector<std::uint64_t> d_offsets(offsets.begin(), offsets.end()), d_edges(edges.begin(), edges.end());
  thrust::device_vector<float> d_rows(rows.begin(), rows.end());

  cunvme::host::page_cache_memory memory(*volumes.gpu, page, o.slots, cunvme::host::gpu_bookkeeping(*volumes.ctrls[0], example::where),
                                         cunvme::host::slot_allocator(cunvme::host::allocate_gpu));
  const cache c(memory.device_view(), volumes.gpu->device_view());
  const cached_graph on_volume{{c, offsets_at, offsets.size()}, {c, edges_at, edges.size()}, {c, 0, o.nodes * 32}};
  const memory_graph in_memory{thrust::raw_pointer_cast(d_offsets.data()), thrust::raw_pointer_cast(d_edges.data()),
                               reinterpret_cast<const float2*>(thrust::raw_pointer_cast(d_rows.data()))};

  thrust::device_vector<std::uint64_t> seeds(o.batch);
  thrust::device_vector<float2> cached_out(o.batch * 32), memory_out(o.batch * 32);
  const example::mapped<outcome> out("allocate the outcome");
  const example::mapped<unsigned long long> differ("allocate the count");
  example::stream s;
  const example::event e[3];
  const auto grid = static_cast<unsigned>((o.batch * 32 + 255) / 256);

  std::printf("gnn_features: %llu nodes, %zu edges (%llu MiB with 256-byte features) striped over %zu controllers; cache %llu MiB in GPU memory; "
              "%llu batches of %llu seeds, fanout %llu\n",
              static_cast<unsigned long long>(o.nodes), edges.size(), static_cast<unsigned long long>(total >> 20), o.uris.size(),
              static_cast<unsigned long long>(o.slots * page >> 20), static_cast<unsigned long long>(o.batches),
              static_cast<unsigned long long>(o.batch), static_cast<unsigned long long>(o.fanout));
  bool all_ok = true;
  double cached_total = 0, memory_total = 0;
  unsigned long long hits_total = 0, misses_total = 0;
  double rows_read = 0;
  for (std::uint64_t b = 0; b < o.batches; ++b) {
    std::vector<std::uint64_t> batch_seeds(o.batch);
    double batch_rows = 0;  // each seed's own row and, where it has edges, `fanout` sampled ones
    for (std::uint64_t k = 0; k < o.batch; ++k) {
      batch_seeds[k] = example::mix((b << 32) + k + 99) % o.nodes;
      batch_rows += 1.0 + (offsets[batch_seeds[k] + 1] > offsets[batch_seeds[k]] ? double(o.fanout) : 0.0);
    }
    thrust::copy(batch_seeds.begin(), batch_seeds.end(), seeds.begin());
    *out = {};
    *differ = 0;
    const cunvme::page_cache_counters before = memory.counters();
    const auto fan = static_cast<std::uint32_t>(o.fanout);
    example::check(cudaEventRecord(e[0], s), "record");
    aggregate<<<grid, 256, 0, s>>>(on_volume, thrust::raw_pointer_cast(seeds.data()), o.batch, fan, b, thrust::raw_pointer_cast(cached_out.data()),
                                   out.get());
    example::check(cudaEventRecord(e[1], s), "record");
    aggregate<<<grid, 256, 0, s>>>(in_memory, thrust::raw_pointer_cast(seeds.data()), o.batch, fan, b, thrust::raw_pointer_cast(memory_out.data()),
                                   out.get());
    example::check(cudaEventRecord(e[2], s), "record");
    count_differences<<<grid, 256, 0, s>>>(thrust::raw_pointer_cast(cached_out.data()), thrust::raw_pointer_cast(memory_out.data()), o.batch * 32,
                                           differ.get());
    example::check(cudaGetLastError(), "launch");
    example::check(cudaStreamSynchronize(s), "run the batch");
    const float cached_ms = example::milliseconds(e[0], e[1]), memory_ms = example::milliseconds(e[1], e[2]);
    const cunvme::page_cache_counters after = memory.counters();
    const unsigned long long hits = after.hits - before.hits, misses = after.misses - before.misses;
    if (out->failed != 0) std::printf("  batch %llu: %llu lanes failed; first: %s\n", static_cast<unsigned long long>(b), out->failed, cunvme::to_string(out->first).c_str());
    if (*differ != 0) std::printf("  batch %llu: %llu values differ from the in-memory computation\n", static_cast<unsigned long long>(b), *differ);
    if (out->failed != 0 || *differ != 0) {
      std::printf("  batch %llu: no figures reported\n", static_cast<unsigned long long>(b));
      all_ok = false;
      continue;
    }
    std::printf("  batch %llu: cache %.3f ms, in GPU memory %.3f ms (%.1fx); %.1f %% hits, %llu page reads; every row verified\n",
                static_cast<unsigned long long>(b), cached_ms, memory_ms, cached_ms / memory_ms, 100.0 * hits / std::max(1ull, hits + misses), misses);
    if (b == 0) continue;  // the first batch fills the cache: the totals are of the batches after it
    cached_total += cached_ms, memory_total += memory_ms, hits_total += hits, misses_total += misses, rows_read += batch_rows;
  }
  if (all_ok && o.batches > 1) {
    std::printf("batches 1-%llu: cache %.1f M rows/s (%.1f GB/s of features), in GPU memory %.1f M rows/s: cache / memory time %.2fx; %.1f %% hits\n",
                static_cast<unsigned long long>(o.batches - 1), rows_read / (cached_total * 1e3), rows_read * row_bytes / (cached_total * 1e6),
                rows_read / (memory_total * 1e3), cached_total / memory_total, 100.0 * hits_total / std::max(1ull, hits_total + misses_total));
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_main("gnn_features", [&] { return run(argc, argv); });
}
