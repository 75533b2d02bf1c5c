// Protocol Buffers messages as the JSON segps writes for users (reports,
// export metadata): field names as in the .proto, every field printed.
#ifndef SEGPS_COMMON_PROTO_JSON_H_
#define SEGPS_COMMON_PROTO_JSON_H_

#include <string>

#include "google/protobuf/message.h"

namespace segps {

std::string ToJson(const google::protobuf::Message& message);

}  // namespace segps

#endif  // SEGPS_COMMON_PROTO_JSON_H_
