"""Generated protobuf code of the RocketMQ 5 protocol (see README.md); not a public API."""
