//! Runs `client_upstream` inputs outside the fuzzer and prints what each
//! came to (status, bytes delivered, clean end, committed): a check that
//! the seeds reach the paths they are named for, and a way to look at an
//! artifact. `cargo run --release --example replay_client_upstream -- FILE...`

fn main() {
    for path in std::env::args().skip(1) {
        let data = std::fs::read(&path).expect("readable");
        println!("{path}: {:?}", rproxy_fuzz::client_upstream::run(&data));
    }
}
