// The EventIdx rule of shadow doorbells (NVMe 2.0 section 5.8, Doorbell Buffer Config).
#pragma once

#include <cunvme/config.cuh>

#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace spec {

/// Whether a host that moved a doorbell from `old_value` to `new_value` in the shadow buffer
/// must also write the MMIO doorbell: yes when the controller's EventIdx lies in
/// [old_value, new_value) modulo 2^16 — the controller asked to be told once the host passes
/// EventIdx. Same formula as Linux's nvme_dbbuf_need_event; at `event_idx == new_value` the
/// host has not passed it yet, so no MMIO write.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool shadow_doorbell_needs_mmio(cuda::std::uint16_t event_idx, cuda::std::uint16_t new_value,
                                                                        cuda::std::uint16_t old_value) noexcept {
  return static_cast<cuda::std::uint16_t>(new_value - event_idx - 1u) < static_cast<cuda::std::uint16_t>(new_value - old_value);
}

/// The 32-bit slot of a queue's doorbell in the Shadow Doorbell and EventIdx buffers: the
/// buffers mirror the doorbell registers' layout, stride included (5.8: "the same offset …
/// as the doorbell register"), so SQ y's tail is slot 2y and CQ y's head slot 2y + 1, each
/// 4 << CAP.DSTRD bytes apart.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t shadow_doorbell_slot(cuda::std::uint16_t qid, bool is_cq,
                                                                                  unsigned dstrd) noexcept {
  return (2u * qid + (is_cq ? 1u : 0u)) * ((4u << dstrd) / 4u);
}
static_assert(shadow_doorbell_slot(0, false, 0) == 0 && shadow_doorbell_slot(1, true, 0) == 3);
static_assert(shadow_doorbell_slot(1, false, 2) == 8);

}  // namespace spec
CUNVME_NAMESPACE_END
