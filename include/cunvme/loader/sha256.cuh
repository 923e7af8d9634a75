// SHA-256 (FIPS 180-4) on the host: the checksum an extent map carries for the file it
// describes (extent_map.cuh). Chosen over CRC-32C because `sha256sum` and every language's
// standard library compute the same digest, so a map's checksum can be checked by tools we
// did not write, and because a 32-bit CRC would let one in 2^32 wrong reads of a large model
// file pass. Plain C++, no dependency; a few hundred MB/s, far below NVMe bandwidth, which is
// acceptable for a check done once per load.
#pragma once

#include <cunvme/config.cuh>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace loader {

/// An incremental SHA-256.
///
/// Usage: examples/snippets/host.cpp, `sha256_of`.
class sha256 {
 public:
  using digest = std::array<std::uint8_t, 32>;

  void update(const void* data, std::size_t bytes) noexcept {
    const auto* p = static_cast<const std::uint8_t*>(data);
    total_ += bytes;
    if (used_ != 0) {
      while (bytes > 0 && used_ < 64) {
        block_[used_++] = *p++;
        --bytes;
      }
      if (used_ < 64) return;
      compress(block_.data());
      used_ = 0;
    }
    for (; bytes >= 64; bytes -= 64, p += 64) compress(p);
    for (std::size_t i = 0; i < bytes; ++i) block_[used_++] = p[i];
  }

  /// The digest of everything given; the object is spent afterwards.
  [[nodiscard]] digest finish() noexcept {
    const std::uint64_t bits = total_ * 8;  // the message length in bits, modulo 2^64 (5.1.1)
    const std::uint8_t one = 0x80;
    update(&one, 1);
    const std::uint8_t zero = 0;
    while (used_ != 56) update(&zero, 1);
    std::uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
    update(length, 8);
    digest out{};
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<std::uint8_t>(h_[i] >> (24 - 8 * j));
    }
    return out;
  }

  /// Lower-case hexadecimal, as `sha256sum` prints it.
  [[nodiscard]] static std::string hex(const digest& d) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s;
    s.reserve(64);
    for (const std::uint8_t b : d) {
      s += digits[b >> 4];
      s += digits[b & 15];
    }
    return s;
  }

 private:
  void compress(const std::uint8_t* block) noexcept {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be,
        0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa,
        0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85,
        0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
        0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f,
        0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::uint32_t w[64];
    for (int t = 0; t < 16; ++t) {
      w[t] = std::uint32_t{block[4 * t]} << 24 | std::uint32_t{block[4 * t + 1]} << 16 | std::uint32_t{block[4 * t + 2]} << 8 | block[4 * t + 3];
    }
    for (int t = 16; t < 64; ++t) {
      const std::uint32_t s0 = std::rotr(w[t - 15], 7) ^ std::rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const std::uint32_t s1 = std::rotr(w[t - 2], 17) ^ std::rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      const std::uint32_t t1 = h + (std::rotr(e, 6) ^ std::rotr(e, 11) ^ std::rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[t] + w[t];
      const std::uint32_t t2 = (std::rotr(a, 2) ^ std::rotr(a, 13) ^ std::rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::array<std::uint32_t, 8> h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<std::uint8_t, 64> block_{};
  std::size_t used_ = 0;
  std::uint64_t total_ = 0;
};

}  // namespace loader
CUNVME_NAMESPACE_END
