// The controller's bring-up steps (3.5.1): admin queues, CC.EN, Identify, Number of Queues,
// Doorbell Buffer Config, the CMB. A reset (recovery.cuh) runs them again.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/controller/controller.cuh>

#include <chrono>
#include <cstring>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace host {

inline void controller::setup_admin_queues() {
  const std::uint32_t n = options_.admin_queue_entries;
  if (n < spec::min_admin_queue_entries || n > spec::max_admin_queue_entries || n > cap_.max_queue_entries()) {
    throw error("Set up admin queues", name_, std::to_string(n) + " entries is outside 2.." + std::to_string(std::min<std::uint32_t>(4096, cap_.max_queue_entries())));
  }
  // ASQ and ACQ must be on a CC.MPS page, not only the 4 KiB their registers can express:
  // a controller with CAP.MPSMIN > 0 fails CC.EN = 1 otherwise (QEMU sets CSTS.CFS).
  dma_buffer sq = host_memory().allocate(std::size_t{n} * sizeof(spec::submission_entry), page_bytes());
  dma_buffer cq = host_memory().allocate(std::size_t{n} * sizeof(spec::completion_entry), page_bytes());
  require_contiguous(sq, "Set up the admin SQ", name_);
  require_contiguous(cq, "Set up the admin CQ", name_);
  const auto size = static_cast<std::uint16_t>(n - 1);
  backend_->write32(spec::to_underlying(spec::register_offset::aqa), spec::aqa_register{}.set_asqs(size).set_acqs(size).raw);
  backend_->write64(spec::to_underlying(spec::register_offset::asq), sq.bus());
  backend_->write64(spec::to_underlying(spec::register_offset::acq), cq.bus());
  admin_ = admin_queue(*backend_, std::move(sq), std::move(cq), n, cap_.dstrd());
}

inline void controller::enable() {
  const auto cc = spec::cc_register{}
                      .set_iosqes(spec::submission_entry_size_log2)
                      .set_iocqes(spec::completion_entry_size_log2)
                      .set_mps(static_cast<std::uint8_t>(page_shift_ - 12))
                      .set_css(spec::cc_css::nvm_command_set)
                      .set_ams(spec::cc_ams::round_robin)
                      .set_en(true);
  backend_->write32(spec::to_underlying(spec::register_offset::cc), cc.raw);
  // CSTS.CFS during bring-up is reported at once, not waited on (3.5.1).
  if (!wait_until([&] { return csts().rdy() || csts().cfs(); }, ready_timeout_)) {
    throw error("Enable", name_, "controller not ready: CSTS.RDY not set within " + std::to_string(ready_timeout_.count()) + " ms (CAP.TO " +
                                     std::to_string(cap_.timeout_ms()) + " ms)");
  }
  if (csts().cfs()) throw error("Enable", name_, "controller fatal status (CSTS.CFS = 1) while enabling");
}

inline void controller::identify_all() {
  dma_buffer page = host_memory().allocate(4096, page_bytes());
  admin(spec::make_identify(spec::identify_cns::controller, 0, page.bus()), "Identify Controller");
  std::memcpy(&identify_, page.data(), sizeof identify_);
  admin(spec::make_identify(spec::identify_cns::active_namespace_list, 0, page.bus()), "Identify Active Namespace List");
  spec::active_namespace_list list;
  std::memcpy(&list, page.data(), sizeof list);
  for (std::uint32_t nsid : list.nsid) {
    if (nsid == 0) break;
    admin(spec::make_identify(spec::identify_cns::namespace_data, nsid, page.bus()), "Identify Namespace " + std::to_string(nsid));
    spec::identify_namespace ns;
    std::memcpy(&ns, page.data(), sizeof ns);
    namespaces_.push_back(describe_namespace(nsid, ns, name_));
  }
}

inline void controller::negotiate_queues() {
  const auto cqe = admin(spec::make_set_number_of_queues(options_.io_queue_pairs, options_.io_queue_pairs), "Set Features Number of Queues");
  const auto sqs = spec::number_of_queues_fields::nsqr::get(cqe.dw0) + 1u;
  const auto cqs = spec::number_of_queues_fields::ncqr::get(cqe.dw0) + 1u;
  // queues_in_bar: the admin queue's doorbells are inside (checked by admin_queue), others may not be.
  granted_ = static_cast<std::uint16_t>(std::min<std::uint32_t>({sqs, cqs, options_.io_queue_pairs, backend_->queues_in_bar(cap_.dstrd()) - 1}));
  used_qids_.assign(granted_ + 1u, false);
  used_qids_[0] = true;
}

inline void controller::configure_shadow_doorbells() {
  const std::size_t page = std::size_t{1} << page_shift_;
  shadow_ = std::make_unique<dma_buffer>(memory().allocate(page, page));
  event_index_ = std::make_unique<dma_buffer>(memory().allocate(page, page));
  admin(spec::make_doorbell_buffer_config(shadow_->bus(), event_index_->bus()), "Doorbell Buffer Config");
}

inline void controller::configure_cmb() {
  const auto msc = spec::to_underlying(spec::register_offset::cmbmsc);
  backend_->write64(msc, spec::cmbmsc_register{}.set_cre(true).raw);
  // A controller that updates registers asynchronously (the emulator polls) shows CMBSZ a
  // moment after CRE; a bounded wait costs nothing where it is immediate.
  const auto cmbsz = [&] { return spec::cmbsz_register{backend_->read32(spec::to_underlying(spec::register_offset::cmbsz))}; };
  if (!wait_until([&] { return cmbsz().raw != 0; }, 1000ms)) throw error("Map CMB", name_, "CAP.CMBS is set but CMBSZ reads 0 after CMBMSC.CRE");
  const spec::cmbloc_register loc{backend_->read32(spec::to_underlying(spec::register_offset::cmbloc))};
  const spec::cmbsz_register sz = cmbsz();
  if (!sz.sqs()) throw error("Map CMB", name_, "the CMB cannot hold submission queues (CMBSZ.SQS = 0)");
  backend_->map_cmb(loc.bir(), std::uint64_t{loc.ofst()} * sz.unit_bytes(), sz.size_bytes());
  if (gpu_) gpu_cmb_ = gpu_(backend_->cmb(), backend_->cmb_size(), backend_->bar_is_io_memory(), "the CMB", name_);
  enable_cmb_at_mapping();
  cmb_used_ = 0;
}

inline void controller::enable_cmb_at_mapping() {
  const auto msc = spec::to_underlying(spec::register_offset::cmbmsc);
  backend_->write64(msc, spec::cmbmsc_register{}.set_cre(true).set_cmse(true).set_controller_base_address(backend_->cmb_bus_address()).raw);
  // Any admin command completes after the controller has taken CMBMSC in.
  (void)admin(spec::make_get_features(spec::feature_id::number_of_queues), "Get Features Number of Queues");
  if (spec::cmbsts_register{backend_->read32(spec::to_underlying(spec::register_offset::cmbsts))}.cbai()) {
    throw error("Map CMB", name_, "the controller refused the CMB base address (CMBSTS.CBAI)");
  }
}

}  // namespace host
CUNVME_NAMESPACE_END
