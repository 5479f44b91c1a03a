class Stage:
    pass


class Sequence:
    def __init__(self, unique_name, monitor_message, stages, enable_model_validation=False):
        self.unique_name = unique_name
        self.monitor_message = monitor_message
        self.stages = list(stages)
        self.enable_model_validation = enable_model_validation
