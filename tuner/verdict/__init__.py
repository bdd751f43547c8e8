"""TODO verdict"""
