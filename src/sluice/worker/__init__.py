"""The engine behind one interface: in-process, or a gRPC worker process/host."""
