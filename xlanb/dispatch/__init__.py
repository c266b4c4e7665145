"""From torch to xlanb: host reads, CPU fallback, in-place layout changes, __torch_dispatch__, the device's registration."""
