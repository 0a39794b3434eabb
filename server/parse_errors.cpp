#include "server/parse_errors.h"

#include <google/protobuf/descriptor.h>

#include <string>

namespace tigon::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/tigon.v1.Trainer/TrainStep" -> "tigon.v1.TrainStepRequest", from the compiled-in descriptors.
std::string RequestType(const std::string& method) {
  const size_t slash = method.rfind('/');
  if (method.size() < 2 || slash == std::string::npos || slash == 0) return "";
  const std::string full_name = method.substr(1, slash - 1) + "." + method.substr(slash + 1);
  const auto* descriptor = google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full_name);
  return descriptor == nullptr ? "" : descriptor->input_type()->full_name();
}

class ParseErrorInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(grpc::experimental::ServerRpcInfo* info) : method_(info->method()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // After a failed parse the call goes on without a request message.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::INTERNAL && status.error_message().empty()) {
        const std::string type = RequestType(method_);
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            "the request to " + method_ + " is not a valid " + (type.empty() ? "protobuf" : type) +
                " message: its bytes do not parse (a truncated or corrupted message, or one of another type)"));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool unparsed_ = false;
};

}  // namespace

grpc::experimental::Interceptor* ParseErrorInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new ParseErrorInterceptor(info);
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> RequestInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<ParseErrorInterceptorFactory>());
  return creators;
}

}  // namespace tigon::server
