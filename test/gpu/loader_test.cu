// The safetensors loader on the GPU path: a file written here, opened through the emulator
// backed by it, loaded whole and layer by layer; every byte checked, the layers' bytes as a
// kernel on the compute stream saw them. Skipped (exit 77) without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/facade/copy.cuh>
#include <cunvme/facade/device.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>
#include <cunvme/loader/loader.cuh>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace loader = cunvme::loader;

namespace {

struct written {
  std::string path;
  std::vector<std::byte> bytes;  // the whole file
};

/// A model of `layers` layers, each a [dim, dim] F32 weight and a [dim] F16 bias (2 KiB at
/// dim 1024: layers share blocks), plus an embedding and a 3-byte U8 tensor that makes every
/// later tensor start off its element boundary when `misalign` is set. Header padded so the
/// data starts on 4 KiB; file padded with zeros to whole 4 KiB blocks.
written write_model(const std::string& path, int layers, std::uint64_t dim, bool misalign) {
  std::vector<std::pair<std::string, std::pair<std::string, std::vector<std::uint64_t>>>> tensors;
  tensors.push_back({"embed.weight", {"F16", {dim, dim}}});
  if (misalign) tensors.push_back({"odd", {"U8", {3}}});
  for (int i = 0; i < layers; ++i) {
    tensors.push_back({"layers." + std::to_string(i) + ".weight", {"F32", {dim, dim}}});
    tensors.push_back({"layers." + std::to_string(i) + ".bias", {"F16", {dim}}});
  }
  nlohmann::json h = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, spec] : tensors) {
    std::uint64_t bytes = spec.first == "F32" ? 4 : spec.first == "F16" ? 2 : 1;
    for (std::uint64_t d : spec.second) bytes *= d;
    h[name] = {{"dtype", spec.first}, {"shape", spec.second}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = h.dump();
  text.append((4096 - (8 + text.size()) % 4096) % 4096, ' ');
  written w{path, {}};
  w.bytes.resize(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) w.bytes[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(w.bytes.data() + 8, text.data(), text.size());
  std::mt19937_64 rng(42);
  for (std::size_t i = 8 + text.size(); i < w.bytes.size(); ++i) w.bytes[i] = static_cast<std::byte>(rng());
  w.bytes.resize((w.bytes.size() + 4095) / 4096 * 4096);  // zeros after the last tensor: whole blocks
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(w.bytes.data()), static_cast<std::streamsize>(w.bytes.size()));
  return w;
}

std::vector<std::byte> to_host(const loader::gpu_tensor& t) {
  std::vector<std::byte> out(static_cast<std::size_t>(t.info->bytes()));
  REQUIRE(cudaMemcpy(out.data(), t.data, out.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  return out;
}

std::vector<std::byte> in_file(const written& w, const loader::safetensors_header& h, const loader::tensor_info& t) {
  const auto* at = w.bytes.data() + h.file_offset(t);
  return {at, at + t.bytes()};
}

/// Sums a tensor's bytes (weighted by position, so a shifted copy does not sum the same).
__global__ void checksum(const unsigned char* p, std::uint64_t n, unsigned long long* out) {
  unsigned long long s = 0;
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) s += (i % 251 + 1) * p[i];
  atomicAdd(out, s);
}

unsigned long long host_checksum(const std::vector<std::byte>& b) {
  unsigned long long s = 0;
  for (std::size_t i = 0; i < b.size(); ++i) s += (i % 251 + 1) * std::to_integer<unsigned long long>(b[i]);
  return s;
}

}  // namespace

TEST_CASE("every tensor loads byte for byte, aligned or not") {
  for (const bool misalign : {false, true}) {
    CAPTURE(misalign);
    const written w = write_model("/tmp/cunvme_loader_test.safetensors", 3, 256, misalign);
    cunvme::device dev("emu:file=" + w.path + ",readonly,lba=4096");
    loader::safetensors_file file(dev, loader::file_placement::contiguous(dev.block_bytes(), 0, w.bytes.size(), dev.ns().lba_count), w.path);
    CHECK(file.header().tensors.size() == (misalign ? 8u : 7u));
    loader::loaded_tensors all = file.load();
    all.wait();
    for (const loader::gpu_tensor& t : all.tensors()) {
      CAPTURE(t.info->name);
      CHECK(to_host(t) == in_file(w, file.header(), *t.info));
      CHECK(t.aligned() == (!misalign || t.info->name == "embed.weight" || t.info->name == "odd"));
    }
    loader::loaded_tensors some = file.load({"layers.1.bias"});
    some.wait();
    REQUIRE(some.find("layers.1.bias") != nullptr);
    CHECK(to_host(*some.find("layers.1.bias")) == in_file(w, file.header(), *file.header().find("layers.1.bias")));
    CHECK(some.bytes_read() <= 2 * 4096);
    CHECK_THROWS_WITH_AS((void)file.load({"nope"}), doctest::Contains("no tensor 'nope'"), cunvme::host::error);
  }
}

TEST_CASE("layers stream with the next one read meanwhile: what the compute stream sees is the file") {
  const written w = write_model("/tmp/cunvme_loader_layers.safetensors", 9, 1024, false);
  cunvme::device dev("emu:file=" + w.path + ",readonly,lba=4096");
  loader::safetensors_file file(dev, loader::file_placement::contiguous(dev.block_bytes(), 0, w.bytes.size(), dev.ns().lba_count), w.path);
  loader::layer_streamer layers(file);
  REQUIRE(layers.size() == 10);  // "" (embed) then layers.0 … layers.8
  CHECK(layers.groups()[0].key == "");
  CHECK(layers.groups()[2].key == "layers.1");
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  unsigned long long* sums = nullptr;
  REQUIRE(cudaMalloc(&sums, 64 * sizeof(unsigned long long)) == cudaSuccess);
  REQUIRE(cudaMemset(sums, 0, 64 * sizeof(unsigned long long)) == cudaSuccess);
  std::vector<unsigned long long> want;
  std::size_t slot = 0;
  while (auto l = layers.next(compute)) {
    for (const loader::gpu_tensor& t : l->tensors) {
      // Several passes: the compute takes long enough for the next layer's reads to run under it.
      for (int pass = 0; pass < 4; ++pass) checksum<<<64, 256, 0, compute>>>(t.as<unsigned char>(), t.info->bytes(), sums + slot);
      want.push_back(4 * host_checksum(in_file(w, file.header(), *t.info)));
      ++slot;
    }
  }
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  std::vector<unsigned long long> got(want.size());
  REQUIRE(cudaMemcpy(got.data(), sums, got.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(got == want);
  CHECK(layers.bytes_read() >= w.bytes.size() - file.header().data_offset - 4096);
  CHECK_FALSE(layers.next(compute).has_value());
  REQUIRE(cudaFree(sums) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(compute) == cudaSuccess);
}

TEST_CASE("a layer stays intact while the next one is current") {
  // The promise: layer k's tensors hold its bytes until `next` has been called twice more. The
  // load stream is drained before each look, so any read the streamer let into layer k's buffer
  // early would have landed.
  const written w = write_model("/tmp/cunvme_loader_lifetime.safetensors", 11, 256, false);
  cunvme::device dev("emu:file=" + w.path + ",readonly,lba=4096");
  loader::safetensors_file file(dev, loader::file_placement::contiguous(dev.block_bytes(), 0, w.bytes.size(), dev.ns().lba_count), w.path);
  loader::layer_streamer layers(file);
  REQUIRE(layers.size() == 12);
  std::optional<loader::layer> previous;
  std::size_t seen = 0;
  while (auto l = layers.next()) {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    for (const std::optional<loader::layer>* which : {&previous, &l}) {
      if (!which->has_value()) continue;
      for (const loader::gpu_tensor& t : (*which)->tensors) {
        CAPTURE(seen);
        CAPTURE(t.info->name);
        CHECK(to_host(t) == in_file(w, file.header(), *t.info));
      }
    }
    previous = std::move(l);
    ++seen;
  }
  CHECK(seen == 12);
}

TEST_CASE("a thread that made no CUDA call yet copies and loads through a device made elsewhere") {
  const written w = write_model("/tmp/cunvme_loader_threads.safetensors", 2, 256, false);
  cunvme::device dev("emu:file=" + w.path + ",readonly,lba=4096");
  const std::size_t bytes = 4 * 4096;
  void* gpu = nullptr;
  REQUIRE(cudaMalloc(&gpu, bytes) == cudaSuccess);
  using get_current = CUresult (*)(CUcontext*);
  const auto current = reinterpret_cast<get_current>(cunvme::host::driver_entry_point("cuCtxGetCurrent"));
  REQUIRE((current != nullptr));

  // copy_n first: its driver look-ups need a context the thread does not have.
  cunvme::io_result result = cunvme::io_result::failure(cunvme::io_error::invalid_request, 0, 0);
  std::string failure;
  CUcontext before = reinterpret_cast<CUcontext>(1), after = reinterpret_cast<CUcontext>(1);
  std::thread([&] {
    try {
      (void)current(&before);
      result = cunvme::copy_n(dev, 0, 4, static_cast<std::byte*>(gpu), nullptr).wait();
      (void)current(&after);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }).join();
  CHECK(failure == "");
  CHECK(result.ok());
  CHECK(before == nullptr);
  CHECK(after == nullptr);  // the thread's (absent) context is left as it was
  std::vector<std::byte> got(bytes);
  REQUIRE(cudaMemcpy(got.data(), gpu, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::equal(got.begin(), got.end(), w.bytes.begin()));

  // The loader likewise, from two fresh threads at once on the one device, several times: each
  // opens the file (its header read through the device), loads it on a non-blocking stream of
  // its own and checks it with synchronous copies on the legacy default stream while the other
  // may be loading. Loads on the legacy default stream would break that: a synchronous copy
  // there on one thread waits for the other thread's read kernel, holding a driver lock that
  // the emulator's copies for that kernel need (the rule in `safetensors_file::load`). The
  // header read did so itself, and one load in two timed out.
  loader::safetensors_file file(dev, loader::file_placement::contiguous(dev.block_bytes(), 0, w.bytes.size(), dev.ns().lba_count), w.path);
  for (int round = 0; round < 8; ++round) {
    std::string failures[2];
    bool matched[2] = {false, false};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        try {
          loader::safetensors_file mine(dev, file.placement(), w.path);
          const loader::detail::owned_stream stream = [&] {
            const auto scope = dev.make_current();  // the thread keeps no context of its own
            return loader::detail::make_stream("Create a stream", "test");
          }();
          loader::loaded_tensors all = mine.load({}, stream.get());
          all.wait();
          bool same = true;
          for (const loader::gpu_tensor& t : all.tensors()) {
            // No doctest assertion off the test's thread: a failed REQUIRE would throw through it.
            std::vector<std::byte> got(static_cast<std::size_t>(t.info->bytes()));
            same = same && cudaMemcpy(got.data(), t.data, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess &&
                   got == in_file(w, mine.header(), *t.info);
          }
          matched[i] = same && all.tensors().size() == 5;
        } catch (const std::exception& e) {
          failures[i] = e.what();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < 2; ++i) {
      CAPTURE(round);
      CAPTURE(i);
      CHECK(failures[i] == "");
      CHECK(matched[i]);
    }
  }
  REQUIRE(cudaFree(gpu) == cudaSuccess);
}

TEST_CASE("a placement of another block size and a damaged header are refused") {
  const written w = write_model("/tmp/cunvme_loader_bad.safetensors", 1, 256, false);
  cunvme::device dev("emu:file=" + w.path + ",readonly,lba=4096");
  CHECK_THROWS_WITH_AS(loader::safetensors_file(dev, loader::file_placement::contiguous(512, 0, w.bytes.size(), 1 << 20), w.path),
                       doctest::Contains("512-byte blocks, the device 4096"), cunvme::host::error);
  // The file claims to be longer than it is: its header runs past the (claimed) end.
  CHECK_THROWS_WITH_AS(loader::safetensors_file(dev, loader::file_placement::contiguous(4096, 0, 4096, dev.ns().lba_count), w.path),
                       doctest::Contains("past the end of the file"), cunvme::host::error);
}

int main(int argc, char** argv) {
  cunvme::emu::prepare_cuda_environment();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA GPU: the loader's GPU test is skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
