// Where a QD 1 read's latency goes (figure P4's analysis in RESULTS.md): one GPU thread
// reads 4 KiB at a time through the emulator and stamps %globaltimer at three points:
//
//   submit     submit_read() from call to return (CID, slot, SQE, doorbell)
//   round trip from the doorbell until the CQE's phase tag shows in the CQ (emulator + PCIe)
//   wait       wait() after the CQE is there (drain, record, CQ doorbell, CID back)
//
// and, before that, what single fences and atomics cost on this GPU, since the submit and
// wait paths are made of them.
//
//   qd1_breakdown [--tier 1|2|3] [--policy shared|exclusive] [--reads N]
//
// `shared` is warp_aggregated slots with a coalescing doorbell (cunvme_bench's default);
// `exclusive` is a queue the thread owns, with a plain MMIO doorbell.
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/backend/emu_backend.cuh>
#include <cunvme/host/gpu/gpu_queue.cuh>
#include <cunvme/io/reader.cuh>

#include <cuda/atomic>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

using namespace cunvme;
using shared_reader = block_reader<queue_policies<slots::warp_aggregated, completion::cooperative>, prp::contiguous, doorbell::coalescing<doorbell::mmio>>;
using owned_reader = block_reader<queue_policies<slots::exclusive, completion::cooperative>, prp::contiguous, doorbell::mmio>;

enum class probe_op { fence_gpu, fence_sys, host_store_fence_gpu, host_store_fence_sys, atomic_seq_cst_gpu, atomic_seq_cst_sys, atomic_relaxed_gpu };
constexpr const char* probe_names[] = {"fence.sc.gpu", "fence.sc.sys", "store to host memory + fence.sc.gpu", "store to host memory + fence.sc.sys",
                                       "fetch_add seq_cst, device scope", "fetch_add seq_cst, system scope", "fetch_add relaxed, device scope"};

template <probe_op Op>
__device__ void step(std::uint32_t* host, std::uint32_t* dev, std::uint32_t i) {
  if constexpr (Op == probe_op::fence_gpu) cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_device);
  if constexpr (Op == probe_op::fence_sys) cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_system);
  if constexpr (Op == probe_op::host_store_fence_gpu) {
    cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(host[i % 64]).store(i, cuda::std::memory_order_relaxed);
    cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_device);
  }
  if constexpr (Op == probe_op::host_store_fence_sys) {
    cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(host[i % 64]).store(i, cuda::std::memory_order_relaxed);
    cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_system);
  }
  if constexpr (Op == probe_op::atomic_seq_cst_gpu) cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device>(dev[0]).fetch_add(1);
  if constexpr (Op == probe_op::atomic_seq_cst_sys) cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(dev[0]).fetch_add(1);
  if constexpr (Op == probe_op::atomic_relaxed_gpu) cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device>(dev[0]).fetch_add(1, cuda::std::memory_order_relaxed);
}

template <probe_op Op>
__global__ void time_op(std::uint32_t* host, std::uint32_t* dev, std::uint32_t n, std::uint64_t* ns) {
  step<Op>(host, dev, 0);
  const std::uint64_t t0 = access::now_ns();
  for (std::uint32_t i = 0; i < n; ++i) step<Op>(host, dev, i);
  ns[static_cast<int>(Op)] = (access::now_ns() - t0) / n;
}

template <class Reader>
__global__ void qd1_reads(Reader r, queue_view q, prp::contiguous buffer, std::uint32_t reads, std::uint64_t* stamps) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (std::uint32_t i = 0; i < reads; ++i) {
    const std::uint64_t t0 = access::now_ns();
    io_handle h = r.submit_read((i * 8ull) % (r.ns().lba_count - 8), 8, buffer, 0);
    const std::uint64_t t1 = access::now_ns();
    // This thread is the queue's only user, so command i's CQE is the queue's i-th.
    const std::uint32_t phase = (i / q.entries) % 2 == 0 ? 1u : 0u;
    auto& dw3 = reinterpret_cast<std::uint32_t*>(q.cq + i % q.entries)[spec::cqe_dword::dw3_offset / 4];
    const std::uint64_t give_up = t1 + q.timeout_ns;
    while ((spec::cqe_dword::phase(cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(dw3).load(cuda::std::memory_order_relaxed)) ? 1u : 0u) != phase &&
           access::now_ns() < give_up) {
    }
    const std::uint64_t t2 = access::now_ns();
    const io_result res = r.wait(h);
    const std::uint64_t t3 = access::now_ns();
    stamps[4 * i] = t0, stamps[4 * i + 1] = t1, stamps[4 * i + 2] = t2, stamps[4 * i + 3] = res.ok() ? t3 : 0;
    if (!res.ok()) return;
  }
}

void check(cudaError_t e, const char* what) { cunvme::host::cuda_check(e, what, "the GPU"); }

void fence_costs() {
  std::uint32_t* host = nullptr;
  std::uint32_t* dev = nullptr;
  std::uint64_t* ns = nullptr;
  check(cudaHostAlloc(&host, 4096, cudaHostAllocMapped), "pinned memory");
  check(cudaMalloc(&dev, 4096), "GPU memory");
  check(cudaMallocManaged(&ns, 8 * 8), "managed memory");
  const std::uint32_t n = 2000;
  time_op<probe_op::fence_gpu><<<1, 1>>>(host, dev, n, ns);
  time_op<probe_op::fence_sys><<<1, 1>>>(host, dev, n, ns);
  time_op<probe_op::host_store_fence_gpu><<<1, 1>>>(host, dev, n, ns);
  time_op<probe_op::host_store_fence_sys><<<1, 1>>>(host, dev, n, ns);
  time_op<probe_op::atomic_seq_cst_gpu><<<1, 1>>>(host, dev, n, ns);
  time_op<probe_op::atomic_seq_cst_sys><<<1, 1>>>(host, dev, n, ns);
  time_op<probe_op::atomic_relaxed_gpu><<<1, 1>>>(host, dev, n, ns);
  check(cudaDeviceSynchronize(), "run the fence probes");
  std::printf("one thread, %u in a row, mean each:\n", n);
  for (int k = 0; k < 7; ++k) std::printf("  %-40s %5llu ns\n", probe_names[k], static_cast<unsigned long long>(ns[k]));
  cudaFreeHost(host), cudaFree(dev), cudaFree(ns);
}

int run(int argc, char** argv) {
  int tier_number = 1;
  std::uint32_t reads = 20000;
  bool owned = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tier" && i + 1 < argc) tier_number = std::atoi(argv[++i]);
    else if (a == "--reads" && i + 1 < argc) reads = static_cast<std::uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    else if (a == "--policy" && i + 1 < argc) owned = std::strcmp(argv[++i], "exclusive") == 0;
    else {
      std::fprintf(stderr, "usage: qd1_breakdown [--tier 1|2|3] [--policy shared|exclusive] [--reads N]\n");
      return 2;
    }
  }
  if (tier_number < 1 || tier_number > 3 || reads < 200) {
    std::fprintf(stderr, "qd1_breakdown: --tier is 1, 2 or 3 and --reads at least 200\n");
    return 2;
  }
  fence_costs();

  emu::controller_config config;
  config.memory = emu::cuda_memory();
  config.workers = 1;
  config.namespaces = {emu::namespace_config::in_memory(512, 1 << 18)};
  host::controller ctrl(std::make_unique<host::emu_backend>(std::move(config)));
  const auto t = static_cast<host::tier>(tier_number);
  auto q = host::make_gpu_queue(ctrl, 1024, t);
  host::dma_buffer buffer = t == host::tier::host_queues_host_data ? ctrl.memory().allocate(1 << 20) : host::allocate_gpu(ctrl, 1 << 20);
  std::uint64_t* stamps = nullptr;
  check(cudaMallocManaged(&stamps, std::size_t{reads} * 4 * 8), "managed memory");
  if (owned) qd1_reads<<<1, 32>>>(owned_reader(q->view(), q->namespace_view(1)), q->view(), prp::contiguous{buffer.bus()}, reads, stamps);
  else qd1_reads<<<1, 32>>>(shared_reader(q->view(), q->namespace_view(1)), q->view(), prp::contiguous{buffer.bus()}, reads, stamps);
  check(cudaDeviceSynchronize(), "run the reads");
  std::vector<double> parts[4];
  for (std::uint32_t i = 100; i < reads; ++i) {  // the first 100 warm up
    const std::uint64_t* s = stamps + 4 * i;
    if (s[3] == 0) {
      std::fprintf(stderr, "qd1_breakdown: read %u failed\n", i);
      return 1;
    }
    parts[0].push_back(static_cast<double>(s[1] - s[0]));
    parts[1].push_back(static_cast<double>(s[2] - s[1]));
    parts[2].push_back(static_cast<double>(s[3] - s[2]));
    parts[3].push_back(static_cast<double>(s[3] - s[0]));
  }
  std::printf("QD 1 4 KiB reads, tier %d, %s, %u reads (emulator, 1 worker):\n", tier_number,
              owned ? "exclusive slots, mmio doorbell" : "warp_aggregated slots, coalescing doorbell", reads);
  const char* names[] = {"submit", "doorbell to CQE visible", "wait after the CQE", "total"};
  for (int k = 0; k < 4; ++k) {
    std::sort(parts[k].begin(), parts[k].end());
    std::printf("  %-26s p50 %7.0f ns   p99 %7.0f ns\n", names[k], parts[k][parts[k].size() / 2], parts[k][parts[k].size() * 99 / 100]);
  }
  cudaFree(stamps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cunvme::emu::prepare_cuda_environment();
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("no CUDA GPU: qd1_breakdown needs one\n");
    return 77;
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qd1_breakdown: %s\n", e.what());
    return 1;
  }
}
