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

}  // namespace spec
CUNVME_NAMESPACE_END
