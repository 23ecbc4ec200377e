"""FedCure cloud server role (see DESIGN.md, Deployment)."""
