//! Criterion benches of the hsync codec (placeholder; the benches follow).

fn main() {}
