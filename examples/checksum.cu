// checksum — a kernel streams a whole namespace and checksums it on the fly, overlapping the
// arithmetic with the I/O: each warp keeps K reads in flight with the asynchronous reader
// (`submit_read`, then `wait`) and sums one buffer while the reads of the next ones land.
//
//   build/examples/checksum                               a 256 MiB emulated namespace, filled here
//   build/examples/checksum emu:blocks=4194304,workers=4  2 GiB, four emulator threads
//   build/examples/checksum emu 8 64                      8 reads in flight per warp, 64 warps
//   build/examples/checksum kmod:0000:01:00.0             a real SSD: read only, nothing to compare with
//
// With the emulator the namespace is filled here and the checksum is compared with one computed
// on the host from the same words. Exits 0 when they agree (or, on a real SSD, when every read
// succeeded), 1 otherwise, 77 (Meson's "skipped") without a CUDA GPU.
#include "example_support.hpp"

#include <cunvme/facade/copy.cuh>

#include <thrust/device_vector.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct outcome {
  unsigned long long sum;     // the checksum, added to by every warp
  unsigned failed;            // set by the first lane whose read failed …
  cunvme::io_result failure;  // … which leaves its result here
};

/// Warp w reads chunks w, w + warps, w + 2·warps … (chunk c: blocks [c·chunk_blocks, …)), each
/// with one command, into its K slots of `buffer` in turn. Lane s holds the handle of slot s:
/// while the warp sums the chunk in one slot, the other K − 1 slots are being filled.
__global__ void stream_checksum(cunvme::device::reader r, cunvme::prp::page_list buffer, const std::uint64_t* data, std::uint32_t chunk_blocks,
                                std::uint32_t k, std::uint64_t warps, outcome* out) {
  const std::uint32_t lane = threadIdx.x % 32;
  const std::uint64_t warp = (std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (warp >= warps) return;  // whole warps only: `warp` is the same in every lane
  const cunvme::namespace_view& ns = r.ns();
  const std::uint64_t chunk_bytes = std::uint64_t{chunk_blocks} * ns.block_bytes();  // with extended LBAs, metadata included
  const std::uint64_t chunks = (ns.lba_count + chunk_blocks - 1) / chunk_blocks;
  const std::uint64_t mine = chunks > warp ? (chunks - warp + warps - 1) / warps : 0;  // chunks this warp reads
  const std::uint64_t first_slot = warp * k;                                           // this warp's slots in `buffer`
  // The j-th chunk of this warp, read into slot j % k. One command each: chunk_blocks ≤ MDTS.
  const auto submit = [&](std::uint64_t j) {
    const std::uint64_t lba = (warp + j * warps) * chunk_blocks;
    const std::uint64_t left = ns.lba_count - lba;  // the last chunk may be short
    return r.submit_read(lba, left < chunk_blocks ? static_cast<std::uint32_t>(left) : chunk_blocks, buffer, (first_slot + j % k) * chunk_bytes);
  };
  cunvme::io_handle h;  // lane s < k: the read in flight into slot s
  if (lane < k && lane < mine) h = submit(lane);
  unsigned long long local = 0;
  for (std::uint64_t j = 0; j < mine; ++j) {
    const std::uint32_t owner = static_cast<std::uint32_t>(j % k);
    bool ok = true;
    if (lane == owner) {
      // The waiting lane's acquire of the completion orders the slot's data after the controller's writes …
      const cunvme::io_result res = r.wait(h);
      ok = res.ok();
      if (!ok && atomicExch(&out->failed, 1u) == 0) out->failure = res;
    }
    __syncwarp();  // … and this barrier orders that before the other lanes' reads of the slot
    if (__shfl_sync(0xffffffffu, ok, owner) == 0) break;  // the same in every lane
    // Sum the chunk: lanes read consecutive words (coalesced).
    const std::uint64_t chunk = warp + j * warps;
    const std::uint64_t left = ns.lba_count - chunk * chunk_blocks;
    const std::uint64_t words = ((left < chunk_blocks ? left : chunk_blocks) * ns.block_bytes()) / 8;
    const std::uint64_t* slot = data + (first_slot + owner) * chunk_bytes / 8;
    const std::uint64_t index = chunk * chunk_bytes / 8;  // of the slot's first word in the namespace
    for (std::uint64_t i = lane; i < words; i += 32) local += example::term(slot[i], index + i);
    __syncwarp();  // every lane has read the slot before the next read may overwrite it
    if (lane == owner && j + k < mine) h = submit(j + k);
  }
  // After a failure, reads may still be in flight into our slots: wait before the kernel ends.
  if (h.state == cunvme::io_handle::phase::in_flight) (void)r.wait(h);
  for (int lanes = 16; lanes > 0; lanes /= 2) local += __shfl_down_sync(0xffffffffu, local, lanes);
  if (lane == 0) atomicAdd(&out->sum, local);
}

int run(const std::string& uri, std::uint32_t k, std::uint64_t max_warps) {
  cunvme::device dev(uri);
  const cunvme::namespace_view& ns = dev.ns();
  const std::uint64_t bytes = ns.lba_count * ns.block_bytes();
  // Fill the emulator's namespace with pseudo-random words, and checksum them on the way.
  std::uint64_t expected = 0;
  const bool emulated = example::fill(dev, [&](std::uint64_t i) {
    const std::uint64_t w = example::mix(i + 1);
    expected += example::term(w, i);
    return w;
  });

  // 128 KiB per command (fewer where MDTS is smaller); one command per chunk.
  const auto chunk_blocks = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(ns.max_blocks, (std::uint64_t{128} << 10) / ns.block_bytes())));
  const std::uint64_t chunk_bytes = std::uint64_t{chunk_blocks} * ns.block_bytes();
  const std::uint64_t chunks = (ns.lba_count + chunk_blocks - 1) / chunk_blocks;
  // Every read in flight holds a command identifier: never more than the queue has.
  const std::uint64_t warps = std::max<std::uint64_t>(1, std::min({max_warps, std::uint64_t{dev.queue().view().cids() / k}, chunks}));

  // K slots per warp of GPU memory the controller can DMA into, and its page table for the reader.
  cunvme::host::dma_buffer buffer = cunvme::host::allocate_gpu(dev.controller(), warps * k * chunk_bytes);
  thrust::device_vector<std::uint64_t> pages(buffer.pages());
  const cunvme::prp::page_list dst{thrust::raw_pointer_cast(pages.data()), static_cast<unsigned>(std::countr_zero(buffer.page_size()))};
  thrust::device_vector<outcome> out(1, outcome{});
  example::stream stream;
  constexpr unsigned per_block = 128;  // 4 warps
  const auto grid = static_cast<unsigned>((warps * 32 + per_block - 1) / per_block);
  const example::timer timer;
  stream_checksum<<<grid, per_block, 0, stream>>>(dev.make_reader(), dst, static_cast<const std::uint64_t*>(buffer.device_data()), chunk_blocks, k,
                                                   warps, thrust::raw_pointer_cast(out.data()));
  example::check(cudaGetLastError(), "launch stream_checksum");
  example::check(cudaStreamSynchronize(stream), "run stream_checksum");
  const double s = timer.seconds();
  const outcome result = out[0];
  std::printf("checksum: %s: %.0f MiB in %llu reads of %llu KiB, %u in flight per warp × %llu warps\n", uri.c_str(),
              static_cast<double>(bytes) / (1 << 20), static_cast<unsigned long long>(chunks), static_cast<unsigned long long>(chunk_bytes >> 10), k,
              static_cast<unsigned long long>(warps));
  if (result.failed != 0) return std::fprintf(stderr, "checksum: a read failed: %s\n", cunvme::to_string(result.failure).c_str()), 1;
  std::printf("  streamed and summed in %.1f ms: %.2f GB/s, %.0f IOPS\n", s * 1e3, static_cast<double>(bytes) / s / 1e9, static_cast<double>(chunks) / s);
  std::printf("  checksum on the GPU  %016llx\n", result.sum);
  if (!emulated) return std::printf("checksum: OK (not the emulator: nothing to compare with)\n"), 0;
  std::printf("  checksum on the host %016llx (of what was written)\n", static_cast<unsigned long long>(expected));
  if (result.sum != expected) return std::fprintf(stderr, "checksum: FAILED: the checksums differ\n"), 1;
  std::printf("checksum: OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::run_main("checksum", [&] {
    const std::string uri = argc > 1 ? argv[1] : "emu:blocks=524288";  // 256 MiB of 512-byte blocks
    const long k = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 4;
    const long warps = argc > 3 ? std::strtol(argv[3], nullptr, 10) : 128;
    if (argc > 4 || k < 1 || k > 32 || warps < 1) return std::fprintf(stderr, "usage: checksum [URI] [reads in flight per warp, 1..32] [warps]\n"), 1;
    return run(uri, static_cast<std::uint32_t>(k), static_cast<std::uint64_t>(warps));
  });
}
