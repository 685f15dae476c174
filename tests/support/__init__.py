"""What the tests share: servers, clients, processes and checks."""
