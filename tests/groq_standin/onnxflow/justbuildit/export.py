from onnxflow.justbuildit.stage import Stage


class OnnxLoad(Stage):
    pass


class ConvertOnnxToFp16(Stage):
    pass
