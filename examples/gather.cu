// gather — an embedding lookup (GNN or DLRM style) from a table larger than the GPU cache that
// holds it: the table lies striped over several controllers, kernels see it as
// `cunvme::array<row>` through a page cache in GPU memory, and each warp gathers 32 random rows
// at once (`array::gather`: the lanes wanting one page take it once). The batch is checked
// against the same gather from a copy of the table in GPU memory, and both are timed.
//
//   build/examples/gather                          4 emulated controllers, a 64 MiB table, 8 MiB of cache
//   build/examples/gather --rows 1048576 --batch 262144 --slots 4096 emu emu
//   build/examples/gather kmod:0000:01:00.0 kmod:0000:02:00.0   real SSDs: the table is written to them first
//
// The table's generator is `value()`: row r, column c holds a float made from a hash of (r, c),
// written through the volume from the host before the kernels run (on a real SSD this
// overwrites the start of each namespace). Exits 0 when every gathered row matches, 1
// otherwise, 77 (Meson's "skipped") without a CUDA GPU.
#include "volume_support.hpp"

#include <cunvme/cache/array.cuh>
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>
#include <cunvme/policy/device_group.cuh>

#include <thrust/device_vector.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr std::uint32_t dim = 32;  // floats a row: 128 bytes
struct row {
  float v[dim];
};

/// The table's generator: row r, column c.
__host__ __device__ float value(std::uint64_t r, std::uint32_t c) {
  return static_cast<float>(example::mix(r * dim + c) >> 40) / 16777216.0f;
}

using queue = example::volume_queue;
using cache = cunvme::page_cache<queue, cunvme::doorbell::mmio>;
using table = cunvme::array<row, cache>;

struct outcome {
  unsigned long long failed;
  cunvme::io_result first;
};

/// Warp w gathers rows idx[32w … 32w + 31] into out.
__global__ void gather_cached(table t, const std::uint64_t* idx, std::uint64_t n, row* out, outcome* o) {
  __shared__ cunvme::warp_group::temp_storage storage[8];  // blocks of 256 threads
  cunvme::warp_group warp(storage[threadIdx.x / 32]);
  const std::uint64_t first = (std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32 * 32;
  if (first >= n) return;  // whole warps: `first` is the same in every lane
  const cunvme::io_result r = t.gather(warp, idx + first, n - first < 32 ? n - first : 32, out + first);
  if (!r.ok() && atomicAdd(&o->failed, 1ull) == 0) o->first = r;
}

/// The same gather from the table in GPU memory.
__global__ void gather_memory(const row* t, const std::uint64_t* idx, std::uint64_t n, row* out) {
  const std::uint64_t k = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k < n) out[k] = t[idx[k]];
}

__global__ void count_differences(const row* a, const row* b, std::uint64_t n, unsigned long long* differ) {
  const std::uint64_t k = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k >= n) return;
  bool same = true;
  for (std::uint32_t c = 0; c < dim; ++c) same = same && __float_as_uint(a[k].v[c]) == __float_as_uint(b[k].v[c]);
  if (!same) atomicAdd(differ, 1ull);
}

struct options {
  std::vector<std::string> uris;
  std::uint64_t rows = 1 << 19;    // 64 MiB
  std::uint64_t batch = 1 << 17;
  std::uint64_t slots = 2048;      // 8 MiB of 4 KiB pages
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto number = [&](std::uint64_t& to) { to = example::positive_number(argc, argv, i); };
    if (a == "--rows") number(o.rows);
    else if (a == "--batch") number(o.batch);
    else if (a == "--slots") number(o.slots);
    else if (a.rfind("--", 0) == 0) throw std::invalid_argument("unknown option " + a + " (--rows N, --batch N, --slots N, then URIs)");
    else o.uris.push_back(a);
  }
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
  // Compared before multiplying: a row count near 2^64 must not wrap into a small table.
  if (o.rows > volumes.bytes() / sizeof(row)) {
    throw std::invalid_argument(std::to_string(o.rows) + " rows of " + std::to_string(sizeof(row)) + " bytes do not fit the volume's " +
                                std::to_string(volumes.bytes() >> 20) + " MiB");
  }
  const std::uint64_t table_bytes = o.rows * sizeof(row);

  // The table: generated on the host, written through the volume, and copied to the GPU for the check.
  std::vector<row> rows(o.rows);
  for (std::uint64_t r = 0; r < o.rows; ++r)
    for (std::uint32_t c = 0; c < dim; ++c) rows[r].v[c] = value(r, c);
  example::write_volume(host_volume, 0, rows.data(), table_bytes, "table");
  thrust::device_vector<row> in_memory(rows.begin(), rows.end());

  std::vector<std::uint64_t> idx(o.batch);
  for (std::uint64_t k = 0; k < o.batch; ++k) idx[k] = example::mix(k + 12345) % o.rows;
  thrust::device_vector<std::uint64_t> d_idx(idx.begin(), idx.end());
  thrust::device_vector<row> cached_out(o.batch), memory_out(o.batch);

  // Slots in the controllers' DMA memory, as tier 1 has its data (no peer-to-peer needed); with
  // peer-to-peer DMA (tier 2) pass cunvme::host::allocate_gpu to put them in GPU memory.
  cunvme::host::page_cache_memory memory(gpu_volume, 4096, o.slots, cunvme::host::gpu_bookkeeping(*volumes.ctrls[0], example::where));
  const table t(cache(memory.device_view(), gpu_volume.device_view()), 0, o.rows);
  const example::mapped<outcome> out("allocate the outcome");
  const example::mapped<unsigned long long> differ("allocate the count");
  example::stream s;
  const example::event e[3];
  const unsigned threads = 256;
  const auto grid = static_cast<unsigned>((o.batch + threads - 1) / threads);

  std::printf("gather: %llu rows of %zu bytes (%llu MiB) striped over %zu controllers by %llu KiB; cache %llu MiB; batch %llu rows\n",
              static_cast<unsigned long long>(o.rows), sizeof(row), static_cast<unsigned long long>(table_bytes >> 20), o.uris.size(),
              static_cast<unsigned long long>(stripe >> 10), static_cast<unsigned long long>(o.slots * 4096 >> 20),
              static_cast<unsigned long long>(o.batch));
  bool all_ok = true;
  for (const char* pass : {"cold", "warm"}) {
    *out = {};
    *differ = 0;
    const cunvme::page_cache_counters before = memory.counters();
    example::check(cudaEventRecord(e[0], s), "record");
    gather_cached<<<grid, threads, 0, s>>>(t, thrust::raw_pointer_cast(d_idx.data()), o.batch, thrust::raw_pointer_cast(cached_out.data()), out.get());
    example::check(cudaEventRecord(e[1], s), "record");
    gather_memory<<<grid, threads, 0, s>>>(thrust::raw_pointer_cast(in_memory.data()), thrust::raw_pointer_cast(d_idx.data()), o.batch,
                                           thrust::raw_pointer_cast(memory_out.data()));
    example::check(cudaEventRecord(e[2], s), "record");
    count_differences<<<grid, threads, 0, s>>>(thrust::raw_pointer_cast(cached_out.data()), thrust::raw_pointer_cast(memory_out.data()), o.batch,
                                               differ.get());
    example::check(cudaGetLastError(), "launch");
    example::check(cudaStreamSynchronize(s), "run the gathers");
    const float cached_ms = example::milliseconds(e[0], e[1]), memory_ms = example::milliseconds(e[1], e[2]);
    const cunvme::page_cache_counters after = memory.counters();
    const unsigned long long hits = after.hits - before.hits, misses = after.misses - before.misses;
    const bool ok = out->failed == 0 && *differ == 0;
    all_ok = all_ok && ok;
    if (out->failed != 0) std::printf("  %s: %llu lanes failed; first: %s\n", pass, out->failed, cunvme::to_string(out->first).c_str());
    if (!ok) {
      std::printf("  %s: %llu rows differ from the in-memory gather: no figures reported\n", pass, *differ);
      continue;
    }
    std::printf("  %s: cache %.2f ms (%.1f M rows/s), in GPU memory %.3f ms; %.1f %% hits, %llu page reads; every row verified\n", pass, cached_ms,
                o.batch / (cached_ms * 1e3), memory_ms, 100.0 * hits / std::max(1ull, hits + misses), misses);
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_main("gather", [&] { return run(argc, argv); });
}
