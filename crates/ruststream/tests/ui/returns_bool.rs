use ruststream::Message;

#[ruststream::handler]
async fn on_order(Message(id): Message<u64>) -> bool {
    id > 0
}

fn main() {}
