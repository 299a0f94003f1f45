"""The benchmark: today's tools as anchors, and faults injected into real healthy runs."""
