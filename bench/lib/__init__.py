"""What the benchmarks share: servers, the load client, sampling, references, results."""
