// ParameterServer's side of the same-host transport (cluster.shared_memory,
// common/shared_region.h): which registrations hold a region, and tensor
// bytes read from and written to one, checked as bytes on the wire are;
// where a push's tensors lie.
#include "absl/strings/str_cat.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "server/parameter_server.h"

namespace segps {

void ParameterServer::OfferRegions(std::string socket) {
  region_socket_ = std::move(socket);
  host_ = SameHostIdentity();
}

absl::Status ParameterServer::AttachRegion(const v1::RegionOffer& offer, std::shared_ptr<SharedRegion> region) {
  MutexLock lock(&secrets_mu_);
  auto it = secrets_.find(offer.worker_id());
  // Compared in constant time, as a call's secret is.
  if (it == secrets_.end() || !ConstantTimeEqual(it->second.bytes, offer.registration_secret())) {
    return absl::NotFoundError(absl::StrCat("no registration of worker ", offer.worker_id(), " with the secret given"));
  }
  it->second.region = std::move(region);
  return absl::OkStatus();
}

absl::Status ParameterServer::GradientInRegion(const v1::TensorSlice& gradient,
                                               const std::shared_ptr<SharedRegion>& region, Payload* data) {
  if (!gradient.has_region_offset()) return absl::OkStatus();
  if (region == nullptr) {
    return absl::InvalidArgumentError(
        "Push gradient: region_offset is set, but this registration handed over no shared region");
  }
  if (data->size() != 0) return absl::InvalidArgumentError("Push gradient: both data and region_offset are set");
  const size_t width = DTypeBytes(gradient.dtype());
  const uint64_t elements = gradient.has_indices() ? gradient.indices().size() / sizeof(uint32_t) : gradient.count();
  if (width == 0 || elements > region->size() / width) {
    // ValidateTensorSlice names a bad dtype; a count this large lies outside any region.
    return absl::InvalidArgumentError(absl::StrCat("Push gradient: ", elements, " elements of ",
                                                   v1::DType_Name(gradient.dtype()), " do not fit the shared region"));
  }
  absl::StatusOr<char*> bytes = region->At(gradient.region_offset(), elements * width, "Push gradient");
  if (!bytes.ok()) return bytes.status();
  *data = Payload::Mapped(absl::string_view(*bytes, elements * width), region);
  return absl::OkStatus();
}

absl::Status ParameterServer::ReplyInRegion(std::optional<uint64_t> reply_offset, size_t bytes,
                                            const std::shared_ptr<SharedRegion>& region, const char* call,
                                            ReadValues* read) {
  if (!reply_offset.has_value()) return absl::OkStatus();
  if (region == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": reply_region_offset is set, but this registration handed over no shared region"));
  }
  absl::StatusOr<char*> at = region->At(*reply_offset, bytes, absl::StrCat(call, " reply_region_offset"));
  if (!at.ok()) return at.status();
  *read = [region, out = *at](absl::Span<const float> values, v1::DType dtype) {
    EncodeValuesTo(values, dtype, out);
  };
  return absl::OkStatus();
}

absl::Status ParameterServer::PushTensors(const v1::PushRequest& request, Range range,
                                          const std::shared_ptr<SharedRegion>& region, Payload* data,
                                          ReadValues* read, std::optional<uint64_t>* reply_offset) {
  const v1::TensorSlice& gradient = request.gradient();
  SEGPS_RETURN_IF_ERROR(GradientInRegion(gradient, region, data));
  SEGPS_RETURN_IF_ERROR(ValidateTensorSlice(gradient, data->size(), range.offset, range.count, "Push gradient"));
  if (gradient.count() == 0 && range.count > 0) return absl::InvalidArgumentError("Push gradient: empty chunk");
  if (request.pull() && request.has_reply_region_offset()) *reply_offset = request.reply_region_offset();
  return ReplyInRegion(*reply_offset, gradient.count() * DTypeBytes(gradient.dtype()), region, "Push", read);
}

}  // namespace segps
