from onnxflow.justbuildit.stage import Stage


class CompileOnnx(Stage):
    pass


class Assemble(Stage):
    pass
