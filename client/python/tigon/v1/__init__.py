# Code generated from proto/tigon/v1/*.proto by client/python/generate_proto.sh.
