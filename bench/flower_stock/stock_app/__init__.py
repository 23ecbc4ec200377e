"""A plain Flower App (stock ``FedAvg`` + a ClientApp with a textbook PyTorch loop): the anchor
``bench/engine.py`` compares the FedCure engine with."""
