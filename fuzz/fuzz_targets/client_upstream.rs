//! F-6: the client proxy's response path end to end, fed the fuzzer's
//! bytes as its upstream's reply. Input layout and oracle:
//! `rproxy_fuzz::client_upstream` (shared with the seed generator).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rproxy_fuzz::client_upstream::run(data);
});
