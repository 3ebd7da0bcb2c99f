use ruststream::memory::MemoryBroker;
use ruststream::{App, Message, on};

#[ruststream::handler]
async fn on_order(Message(id): Message<u64>) -> bool {
    id > 0
}

fn main() {
    let broker = MemoryBroker::new();
    let _app = App::new().register(on(broker.topic("orders"), on_order));
}
