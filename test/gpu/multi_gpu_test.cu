// Several GPUs on one controller: one process with a device per GPU over one emulator, and one
// process per GPU attached to an emulator another process owns (host/sharing/), each reading
// straight into its own GPU's memory; a process killed mid-run is reclaimed and the others go
// on. Every byte read is checked against the namespace's pattern. Written for any number of
// GPUs; with one GPU the cases run on it alone (their GPU count is 1), with none they skip.
//
// The processes per GPU are this program run again (posix_spawn of /proc/self/exe with the
// "(child process)" case selected), as torch.distributed runs one process per GPU.
#include <cunvme/emu/gpu_null_controller.cuh>
#include <cunvme/facade/copy.cuh>
#include <cunvme/facade/device.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>
#include <cunvme/host/open.cuh>
#include <cunvme/host/sharing/controller_owner.cuh>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "../child_processes.hpp"

#include <cuda_runtime.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace cunvme;
using namespace std::chrono_literals;

namespace {

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// Reads `blocks` at `lba` into a fresh buffer on `dev`'s GPU and counts the words that are not
/// the pattern; -1 where the copy itself failed.
long long read_and_count_wrong(device& dev, std::uint64_t lba, std::uint64_t blocks) {
  const auto scope = dev.make_current();
  const std::size_t bytes = blocks * dev.block_bytes();
  void* gpu = nullptr;
  if (cudaMalloc(&gpu, bytes) != cudaSuccess) return -1;
  // Registered, so that its mapping (for an attached process: the owner's opening of its CUDA IPC
  // export) is gone before the memory is freed.
  dev.register_buffer(gpu, bytes);
  cudaStream_t stream = nullptr;
  (void)cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const io_result r = copy_n(dev, lba, blocks, static_cast<std::byte*>(gpu), stream).wait();
  std::vector<std::uint64_t> words(bytes / 8);
  const bool back = cudaMemcpy(words.data(), gpu, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
  dev.deregister_buffer(gpu);
  (void)cudaStreamDestroy(stream);
  (void)cudaFree(gpu);
  if (!r || !back) return -1;
  long long wrong = 0;
  for (std::size_t w = 0; w < words.size(); ++w) wrong += words[w] != host::pattern_word(lba * dev.block_bytes() + 8 * w);
  return wrong;
}

std::string env_of(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

pid_t spawn_gpu_child(const std::string& socket, int gpu, unsigned rounds, const std::string& progress) {
  const pid_t pid = test::spawn_self({"--test-case=(child process)*", "--no-skip", "--no-intro", "--no-version"},
                                     {"CUNVME_MULTI_SOCKET=" + socket, "CUNVME_MULTI_GPU=" + std::to_string(gpu),
                                      "CUNVME_MULTI_ROUNDS=" + std::to_string(rounds), "CUNVME_MULTI_PROGRESS=" + progress});
  REQUIRE(pid > 0);
  return pid;
}

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

constexpr std::uint64_t blocks_per_read = 2048;  // 1 MiB of 512-byte blocks

}  // namespace

TEST_CASE("one process: a device per GPU over one emulator, each with its own queue pairs, all reading into their own GPU at once") {
  const int gpus = gpu_count();
  if (gpus == 0) return;
  MESSAGE(gpus << " GPU(s)");
  // Four queue pairs per GPU out of the 64 the controller grants (8 GPUs fit).
  device_options options;
  options.controller.io_queue_pairs = 64;
  options.tuning = copy_tuning{4, 32, 4};
  std::vector<std::unique_ptr<device>> devices;
  options.gpu = 0;
  devices.push_back(std::make_unique<device>("emu:pattern,blocks=1048576,workers=4", options));
  for (int g = 1; g < gpus; ++g) {
    options.gpu = g;
    devices.push_back(std::make_unique<device>(devices.front()->shared_controller(), options));
  }
  for (int g = 0; g < gpus; ++g) CHECK(devices[g]->gpu() == g);
  std::vector<long long> wrong(gpus, 0);
  std::vector<std::thread> threads;
  for (int g = 0; g < gpus; ++g) {
    threads.emplace_back([&, g] {
      for (unsigned round = 0; round < 16 && wrong[g] == 0; ++round) {
        wrong[g] = read_and_count_wrong(*devices[g], (static_cast<std::uint64_t>(g) * 16 + round) * blocks_per_read, blocks_per_read);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int g = 0; g < gpus; ++g) {
    CAPTURE(g);
    CHECK(wrong[g] == 0);
  }
  // Their queues are their own: every queue pair of every device has its own identifier.
  std::vector<int> ids;
  for (auto& d : devices) {
    const auto set = d->readers();
    for (std::uint32_t q = 0; q < set.count; ++q) ids.push_back(set.views[q].qid);
  }
  CHECK(ids.size() == 4u * static_cast<std::size_t>(gpus));
  std::sort(ids.begin(), ids.end());
  CHECK(std::unique(ids.begin(), ids.end()) == ids.end());
  // A GPU that does not exist is named.
  CHECK_THROWS_WITH_AS(device(devices.front()->shared_controller(), device_options{.gpu = gpus}), doctest::Contains("device_options::gpu"), host::error);
}

namespace {

using null_reader = cunvme::block_reader<device::queue_bundle, prp::contiguous, doorbell::coalescing<doorbell::mmio>>;

/// Each thread reads 8 blocks into its own 4 KiB of `dst` and counts the words that are not the
/// pattern: through queue `t / 32 % queues` of `views`.
__global__ void read_shared_drive(const queue_view* views, unsigned queues, namespace_view ns, std::byte* dst, unsigned gpu, unsigned long long* failed,
                                  unsigned long long* wrong) {
  const std::uint64_t t = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const null_reader r(views[t / 32 % queues], ns);
  const std::uint64_t lba = ((std::uint64_t{gpu} << 16) + t * 8) % (ns.lba_count - 8);
  if (!r.read(lba, 8, prp::contiguous{reinterpret_cast<std::uint64_t>(dst)}, t * 4096)) {
    atomicAdd(failed, 1ull);
    return;
  }
  const auto* words = reinterpret_cast<const std::uint64_t*>(dst + t * 4096);
  for (unsigned w = 0; w < 512; ++w) {
    if (words[w] != host::pattern_word(lba * 512 + 8 * w)) atomicAdd(wrong, 1ull);
  }
}

}  // namespace

TEST_CASE("GPUs sharing one on-GPU modelled drive: each GPU's queue pairs in its own memory, every block read checked") {
  const int gpus = gpu_count();
  if (gpus == 0) return;
  constexpr unsigned queues_per_gpu = 4, threads = 4096;
  emu::gpu_null_controller::options o;
  o.queues = queues_per_gpu * static_cast<unsigned>(gpus);
  o.entries = 256;
  o.lba_count = std::uint64_t{1} << 17;  // 64 MiB in GPU 0's memory
  o.move_data = true;
  o.blocks = 8;
  for (int g = 0; g < gpus; ++g) o.queue_gpus.insert(o.queue_gpus.end(), queues_per_gpu, g);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  emu::prepare_kernels_to_run_beside(read_shared_drive);
  emu::gpu_null_controller drive(o);
  {
    std::vector<std::uint64_t> words((o.lba_count << 9) / 8);
    for (std::size_t i = 0; i < words.size(); ++i) words[i] = host::pattern_word(8 * i);
    REQUIRE(cudaMemcpy(drive.data(), words.data(), words.size() * 8, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  // Everything each GPU needs is made before the drive starts and freed after it stops: the
  // controller kernel runs until told, and cudaDeviceSynchronize or cudaFree would wait for it.
  struct gpu_side {
    queue_view* views = nullptr;
    std::byte* dst = nullptr;
    unsigned long long* counts = nullptr;  // failed, wrong
    cudaStream_t stream = nullptr;
  };
  std::vector<gpu_side> sides(gpus);
  for (int g = 0; g < gpus; ++g) {
    gpu_side& s = sides[g];
    REQUIRE(cudaSetDevice(g) == cudaSuccess);
    REQUIRE(cudaMalloc(&s.views, sizeof(queue_view) * queues_per_gpu) == cudaSuccess);
    REQUIRE(cudaMalloc(&s.dst, std::size_t{threads} * 4096) == cudaSuccess);
    REQUIRE(cudaMalloc(&s.counts, 2 * sizeof(unsigned long long)) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaMemcpy(s.views, drive.views().data() + static_cast<std::size_t>(g) * queues_per_gpu, sizeof(queue_view) * queues_per_gpu,
                       cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemset(s.counts, 0, 2 * sizeof(unsigned long long)) == cudaSuccess);
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  drive.start();
  std::vector<unsigned long long> failed(gpus, ~0ull), wrong(gpus, ~0ull);
  std::vector<std::thread> launchers;
  for (int g = 0; g < gpus; ++g) {
    launchers.emplace_back([&, g] {
      (void)cudaSetDevice(g);
      gpu_side& s = sides[g];
      read_shared_drive<<<threads / 256, 256, 0, s.stream>>>(s.views, queues_per_gpu, drive.namespace_view(), s.dst, static_cast<unsigned>(g), s.counts,
                                                              s.counts + 1);
      unsigned long long c[2] = {0, 0};
      if (cudaMemcpyAsync(c, s.counts, sizeof c, cudaMemcpyDeviceToHost, s.stream) == cudaSuccess && cudaStreamSynchronize(s.stream) == cudaSuccess) {
        failed[g] = c[0];
        wrong[g] = c[1];
      }
    });
  }
  for (auto& t : launchers) t.join();
  (void)cudaSetDevice(0);
  drive.stop();
  for (int g = 0; g < gpus; ++g) {
    CAPTURE(g);
    CHECK(failed[g] == 0);
    CHECK(wrong[g] == 0);
    (void)cudaSetDevice(g);
    (void)cudaStreamDestroy(sides[g].stream);
    (void)cudaFree(sides[g].views);
    (void)cudaFree(sides[g].dst);
    (void)cudaFree(sides[g].counts);
  }
  (void)cudaSetDevice(0);
}

TEST_CASE("(child process) attached to a shared emulator, reads into its GPU until told or killed" * doctest::skip()) {
  const std::string socket = env_of("CUNVME_MULTI_SOCKET");
  REQUIRE_MESSAGE(!socket.empty(), "run by the multi-process case only");
  const int gpu = std::stoi(env_of("CUNVME_MULTI_GPU"));
  const unsigned rounds = static_cast<unsigned>(std::stoul(env_of("CUNVME_MULTI_ROUNDS")));
  const std::string progress = env_of("CUNVME_MULTI_PROGRESS");
  device_options options;
  options.gpu = gpu;
  options.tuning = copy_tuning{4, 32, 4};
  device dev("attach:" + socket, options);
  REQUIRE(dev.controller().attached());
  for (unsigned round = 0; round < rounds; ++round) {
    const long long wrong = read_and_count_wrong(dev, (static_cast<std::uint64_t>(gpu) * 64 + round % 64) * blocks_per_read, blocks_per_read);
    REQUIRE(wrong == 0);
    if (round == 0) std::ofstream(progress) << "running\n";
  }
}

TEST_CASE("one process per GPU attached to an emulator another process owns: every read verified, a process killed mid-run reclaimed") {
  const int gpus = gpu_count();
  if (gpus == 0) return;
  // The owner: this process, with an emulator whose DMA reaches the children's GPU memory.
  const std::string path = "/tmp/cunvme-multi-gpu-" + std::to_string(::getpid()) + ".sock";
  host::controller_options controller;
  controller.io_queue_pairs = 64;
  auto ctrl = host::open("emu:shared,pattern,blocks=1048576,workers=4", controller, host::gpu_reach());
  host::sharing::controller_owner owner(*ctrl, path);
  // One process per GPU, and one more on GPU 0 that is killed once it has read.
  const unsigned rounds = 32;
  std::vector<pid_t> pids;
  std::vector<std::string> progress;
  for (int g = 0; g <= gpus; ++g) {
    progress.push_back(path + ".progress" + std::to_string(g));
    pids.push_back(spawn_gpu_child(path, g == gpus ? 0 : g, g == gpus ? 1000000 : rounds, progress.back()));
  }
  const std::size_t victim = pids.size() - 1;
  const auto until = std::chrono::steady_clock::now() + 120s;
  while (!exists(progress[victim]) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  REQUIRE(exists(progress[victim]));
  REQUIRE(::kill(pids[victim], SIGKILL) == 0);
  for (std::size_t i = 0; i < pids.size(); ++i) {
    CAPTURE(i);
    const int status = test::wait_bounded(pids[i], 180s);
    if (i == victim) {
      CHECK((status != -1 && WIFSIGNALED(status)));
    } else {
      CHECK((status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
  }
  for (const auto& p : progress) ::unlink(p.c_str());
  const auto reclaimed_by = std::chrono::steady_clock::now() + 30s;
  while (owner.processes_reclaimed() < pids.size() && std::chrono::steady_clock::now() < reclaimed_by) std::this_thread::sleep_for(10ms);
  CHECK(owner.processes_reclaimed() == pids.size());
  CHECK(owner.queue_ids_held() == 0);
  CHECK(owner.queues_reclaimed() >= 2);  // the victim's SQs and CQs, deleted by the owner
}

int main(int argc, char** argv) {
  // The emulator's workers need the driver settings of host::prepare_cuda_environment before
  // the first CUDA call (the children are this program too).
  host::prepare_cuda_environment();
  if (gpu_count() == 0) {
    std::puts("no CUDA GPU: skipped");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
