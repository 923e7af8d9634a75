// The emulator with CUDA: BAR0 in pinned, mapped memory that kernels store to, and data moved
// to and from GPU memory before completions are posted. Exits 77 (skipped) without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include "test_host.hpp"

#include <cunvme/emu/cuda_memory.cuh>

#include <cstdio>

using namespace test;

namespace {

#define REQUIRE_CUDA(call) REQUIRE((call) == cudaSuccess)

/// Pinned host memory the GPU can read and write, registered with the emulator's IOMMU.
struct pinned {
  pinned(emu::controller& c, std::size_t n) : ctrl(c), bytes(n) {
    REQUIRE_CUDA(cudaHostAlloc(&data, n, cudaHostAllocMapped));
    std::memset(data, 0, n);
    bus = c.dma().map(data, n);
  }
  ~pinned() {
    ctrl.dma().unmap(bus);
    cudaFreeHost(data);
  }
  emu::controller& ctrl;
  std::size_t bytes;
  void* data = nullptr;
  std::uint64_t bus = 0;
};

/// GPU memory registered as a device region.
struct device_memory {
  device_memory(emu::controller& c, std::size_t n) : ctrl(c), bytes(n) {
    REQUIRE_CUDA(cudaMalloc(&data, n));
    REQUIRE_CUDA(cudaMemset(data, 0, n));
    // cudaMemset runs on the legacy stream, asynchronously, and the emulator copies on
    // non-blocking streams that do not wait for it: done before the region is used, or a
    // memset delayed by another process's kernels lands on the data a read put there.
    REQUIRE_CUDA(cudaDeviceSynchronize());
    bus = c.dma().map(data, n, emu::memory_kind::device);
  }
  ~device_memory() {
    ctrl.dma().unmap(bus);
    cudaFree(data);
  }
  emu::controller& ctrl;
  std::size_t bytes;
  void* data = nullptr;
  std::uint64_t bus = 0;
};

emu::controller_config cuda_config() {
  emu::controller_config config;
  config.memory = emu::cuda_memory();
  config.namespaces = {emu::namespace_config::in_memory(512, 1 << 16)};
  return config;
}

__global__ void ring(std::uint32_t* doorbell, std::uint32_t value) { *reinterpret_cast<volatile std::uint32_t*>(doorbell) = value; }

/// One GPU thread submits `sqe` to slot 0 of a fresh queue, rings, and polls the CQ with a
/// bounded number of polls. Writes the CQE's DW3 (or 0 on timeout) to `result`.
__global__ void submit_and_poll(spec::submission_entry* sq, const spec::submission_entry sqe, std::uint32_t* sq_doorbell,
                                volatile std::uint32_t* cq_dw3, std::uint32_t* cq_doorbell, std::uint32_t* result) {
  *sq = sqe;
  __threadfence_system();  // the whole SQE before the doorbell (ordering rule 1)
  *reinterpret_cast<volatile std::uint32_t*>(sq_doorbell) = 1;
  std::uint32_t dw3 = 0;
  for (long long polls = 0; polls < (1ll << 26); ++polls) {
    dw3 = *cq_dw3;
    if ((dw3 >> 16) & 1u) break;
  }
  __threadfence_system();
  if ((dw3 >> 16) & 1u) *reinterpret_cast<volatile std::uint32_t*>(cq_doorbell) = 1;
  *result = (dw3 >> 16) & 1u ? dw3 : 0u;
}

/// Runs `submit_and_poll` on queue pair 1 of `ctrl` (SQ and CQ at the given GPU-usable
/// addresses) and returns the CQE's DW3, or 0 when none came.
std::uint32_t kernel_submits(emu::controller& ctrl, void* sq, void* cq, spec::submission_entry sqe) {
  std::uint32_t* result = nullptr;
  REQUIRE_CUDA(cudaMallocManaged(&result, sizeof *result));
  submit_and_poll<<<1, 1>>>(static_cast<spec::submission_entry*>(sq), sqe,
                            reinterpret_cast<std::uint32_t*>(ctrl.bar() + spec::sq_tail_doorbell_offset(1, 0)),
                            reinterpret_cast<std::uint32_t*>(static_cast<std::byte*>(cq) + 12),
                            reinterpret_cast<std::uint32_t*>(ctrl.bar() + spec::cq_head_doorbell_offset(1, 0)), result);
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const std::uint32_t dw3 = *result;
  cudaFree(result);
  return dw3;
}

}  // namespace

TEST_CASE("BAR0 is pinned, mapped memory: a store from a kernel reaches the controller") {
  emu::controller ctrl(cuda_config());
  test_host host(ctrl);
  REQUIRE(host.enable());
  cudaPointerAttributes attributes{};
  REQUIRE_CUDA(cudaPointerGetAttributes(&attributes, ctrl.bar()));
  CHECK(attributes.type == cudaMemoryTypeHost);
  // A doorbell of a queue that does not exist: the controller must notice the GPU's store.
  auto* doorbell = reinterpret_cast<std::uint32_t*>(ctrl.bar() + spec::sq_tail_doorbell_offset(9, 0));
  ring<<<1, 1>>>(doorbell, 5);
  REQUIRE_CUDA(cudaDeviceSynchronize());
  CHECK(test_host::eventually([&] { return ctrl.stats().doorbell_errors == 1; }));
}

TEST_CASE("with CUDA memory a namespace is pinned a granule at a time as reads into GPU memory use it, and unpinned when the controller goes") {
  // Granules of 64 KiB and a read across the boundary of the first two: CUDA refuses a copy
  // whose host side spans two registrations, so the controller must split it there.
  auto config = cuda_config();
  config.pinning.granule_bytes = 64 * 1024;
  config.pinning.ahead = 0;
  void* mapping = nullptr;
  unsigned flags = 0;
  {
    emu::controller ctrl(config);
    mapping = ctrl.store(1).mapping();
    CHECK(ctrl.namespace_pinned_bytes(1) == 0);
    CHECK(cudaHostGetFlags(&flags, mapping) != cudaSuccess);  // nothing pinned at construction
    (void)cudaGetLastError();
    test_host host(ctrl);
    REQUIRE(host.enable());
    auto q = host.create_pair(1, 16);
    std::vector<std::byte> expect(128 * 1024);
    for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = static_cast<std::byte>(i * 29 + i / 4096);
    ctrl.store(1).write(0, expect.data(), expect.size());
    device_memory gpu(ctrl, 8192);
    REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 120, 16, gpu.bus, gpu.bus + 4096)).status() == spec::status::successful_completion);
    std::vector<std::byte> back(8192);
    REQUIRE_CUDA(cudaMemcpy(back.data(), gpu.data, back.size(), cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(back.data(), expect.data() + 120 * 512, back.size()) == 0);
    CHECK(ctrl.namespace_pinned_bytes(1) == 128 * 1024);
    CHECK(cudaHostGetFlags(&flags, mapping) == cudaSuccess);  // the driver knows it as pinned memory
    CHECK(cudaHostGetFlags(&flags, static_cast<std::byte*>(mapping) + 64 * 1024) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
  }
  CHECK(cudaHostGetFlags(&flags, mapping) != cudaSuccess);  // unregistered before it was unmapped
  (void)cudaGetLastError();
}

TEST_CASE("a read lands in GPU memory before its completion is posted") {
  emu::controller ctrl(cuda_config());
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto q = host.create_pair(1, 16);
  std::vector<std::byte> expect(64 * 1024);
  for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = static_cast<std::byte>(i * 13 + 5);
  ctrl.store(1).write(0, expect.data(), expect.size());
  device_memory gpu(ctrl, expect.size());
  dma_buffer list(ctrl, 4096);
  for (int i = 1; i < 16; ++i) list.as<std::uint64_t>()[i - 1] = gpu.bus + 4096u * i;
  const auto cqe = host.run(*q, spec::make_rw(spec::nvm_opcode::read, 1, 0, 128, gpu.bus, list.bus));
  REQUIRE(cqe.status() == spec::status::successful_completion);
  std::vector<std::byte> back(expect.size());
  REQUIRE_CUDA(cudaMemcpy(back.data(), gpu.data, back.size(), cudaMemcpyDeviceToHost));
  CHECK(back == expect);
}

TEST_CASE("a write takes its data from GPU memory") {
  emu::controller ctrl(cuda_config());
  test_host host(ctrl);
  REQUIRE(host.enable());
  auto q = host.create_pair(1, 16);
  device_memory gpu(ctrl, 8192);
  std::vector<std::byte> data(8192, std::byte{0x3c});
  REQUIRE_CUDA(cudaMemcpy(gpu.data, data.data(), data.size(), cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy returns once the data is staged, before its DMA into GPU
  // memory is done (CUDA's "API synchronization behavior"); the controller must find it there.
  REQUIRE_CUDA(cudaDeviceSynchronize());
  REQUIRE(host.run(*q, spec::make_rw(spec::nvm_opcode::write, 1, 64, 16, gpu.bus, gpu.bus + 4096)).status() ==
          spec::status::successful_completion);
  std::vector<std::byte> back(8192);
  ctrl.store(1).read(64 * 512, back.data(), back.size());
  CHECK(back == data);
}

TEST_CASE("a kernel submits a read, rings the doorbell, polls the completion and finds the data in GPU memory") {
  emu::controller ctrl(cuda_config());
  test_host host(ctrl);
  REQUIRE(host.enable());
  pinned sq(ctrl, 4096), cq(ctrl, 4096);
  REQUIRE(host.admin_status(spec::make_create_io_cq(1, 16, cq.bus)) == spec::status::successful_completion);
  REQUIRE(host.admin_status(spec::make_create_io_sq(1, 16, sq.bus, 1)) == spec::status::successful_completion);
  std::vector<std::byte> expect(4096);
  for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = static_cast<std::byte>(i ^ 0x5a);
  ctrl.store(1).write(8 * 512, expect.data(), expect.size());
  device_memory gpu(ctrl, 4096);
  auto sqe = spec::make_rw(spec::nvm_opcode::read, 1, 8, 8, gpu.bus);
  sqe.set_cid(77);
  const std::uint32_t dw3 = kernel_submits(ctrl, sq.data, cq.data, sqe);
  REQUIRE(dw3 != 0);
  CHECK((dw3 & 0xffffu) == 77);
  CHECK(spec::cqe_status::status_of(static_cast<std::uint16_t>(dw3 >> 16)) == spec::status::successful_completion);
  std::vector<std::byte> back(4096);
  REQUIRE_CUDA(cudaMemcpy(back.data(), gpu.data, back.size(), cudaMemcpyDeviceToHost));
  CHECK(back == expect);
}

TEST_CASE("queues in GPU memory: the controller fetches SQEs from and posts CQEs to device memory") {
  emu::controller ctrl(cuda_config());
  test_host host(ctrl);
  REQUIRE(host.enable());
  device_memory sq(ctrl, 4096), cq(ctrl, 4096), data(ctrl, 4096);
  REQUIRE(host.admin_status(spec::make_create_io_cq(1, 16, cq.bus)) == spec::status::successful_completion);
  REQUIRE(host.admin_status(spec::make_create_io_sq(1, 16, sq.bus, 1)) == spec::status::successful_completion);
  std::vector<std::byte> expect(4096);
  for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = static_cast<std::byte>(i * 3);
  ctrl.store(1).write(0, expect.data(), expect.size());
  auto sqe = spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, data.bus);
  sqe.set_cid(5);
  const std::uint32_t dw3 = kernel_submits(ctrl, sq.data, cq.data, sqe);
  REQUIRE(dw3 != 0);
  CHECK((dw3 & 0xffffu) == 5);
  std::vector<std::byte> back(4096);
  REQUIRE_CUDA(cudaMemcpy(back.data(), data.data, back.size(), cudaMemcpyDeviceToHost));
  CHECK(back == expect);
}

int main(int argc, char** argv) {
  cunvme::emu::prepare_cuda_environment();  // before any CUDA call: kernels wait for emulated I/O
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("skipped: no CUDA device");
    return 77;  // Meson's exit code for a skipped test
  }
  doctest::Context context(argc, argv);
  return context.run();
}
