"""One model on one device: request state, scheduler, KV block manager, engine loop, async front."""
