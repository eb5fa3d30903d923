"""Update rules applied in place to the shared weights: SGD, momentum, learning-rate schedules."""
