"""RocketMQ 5 gRPC front end of the broker (``halfmoon-broker serve --grpc-port``)."""
