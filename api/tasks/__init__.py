"""A task's way through the API: checked, admitted, recorded, sent to its model's topic, waited for and read."""
