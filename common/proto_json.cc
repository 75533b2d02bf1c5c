#include "common/proto_json.h"

#include "google/protobuf/util/json_util.h"

namespace segps {

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing fails only for Any fields of unknown types, which segps's messages do not have.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

}  // namespace segps
