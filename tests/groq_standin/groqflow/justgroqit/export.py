from onnxflow.justbuildit.stage import Stage


class CheckOnnxCompatibility(Stage):
    pass
