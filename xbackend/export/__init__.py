"""PyTorch modules exported to ONNX, with their example inputs."""
