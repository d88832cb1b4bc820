"""Running the model: sessions and generation, prompt reading, compiled steps, chat, batching, tensor parallelism."""
