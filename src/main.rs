fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The shim must be dispatched before any thread exists: libcontainer forks.
    if args.get(1).map(String::as_str) == Some("shim") {
        std::process::exit(holdfast::runtime::shim_main(&args[2..]));
    }
}
